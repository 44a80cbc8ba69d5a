"""Image datasets: the bundled MNIST subset, IDX files, Fashion-MNIST, CIFAR-10, sklearn digits and
image folders, all loaded into one :class:`ImageDataset` shape (float32 NCHW in [0, 1]).

Every problem with the input (missing file, truncated data, wrong magic number, mismatched counts,
a pickle that tries to run code) is raised as :class:`~exhume.errors.DataError` naming the file and
what was expected versus found.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from exhume.errors import ConfigError, DataError
from exhume.files.binary import open_image_checked, read_idx, read_member
from exhume.files.limits import LIMITS

MNIST_CLASSES = [str(i) for i in range(10)]
FASHION_CLASSES = ["t-shirt/top", "trouser", "pullover", "dress", "coat",
                   "sandal", "shirt", "sneaker", "bag", "ankle boot"]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck"]
#: Where Debian's ``dataset-fashion-mnist`` package installs the gzipped IDX files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DATASET_NAMES = ("mnist", "fashion-mnist", "cifar10", "digits", "folder")
SPLITS = ("train", "test")
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


@dataclass
class ImageDataset:
    images: np.ndarray  # float32, (N, C, H, W), values in [0, 1]
    labels: np.ndarray  # int64 class ids, (N,)
    name: str  # e.g. "mnist", "fashion-mnist", "cifar10", "digits"
    class_names: list[str]
    root: str | None = None  # where it was loaded from (None: bundled / built in)
    split: str = "train"

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.labels.ndim != 1 or len(self.images) != len(self.labels):
            raise DataError(f"dataset {self.name!r}: expected images (N, C, H, W) and labels (N,), "
                            f"got {self.images.shape} and {self.labels.shape}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


def _class_names_for(labels: np.ndarray) -> list[str]:
    return [str(i) for i in range(int(labels.max()) + 1)] if labels.size else []


def load_idx(images_path, labels_path, name: str = "idx") -> ImageDataset:
    """Load an IDX image file (magic 0x803) and label file (magic 0x801), gzipped or not."""
    images_path, labels_path = Path(images_path), Path(labels_path)
    imgs = read_idx(images_path, 0x00000803, "IDX images")
    labs = read_idx(labels_path, 0x00000801, "IDX labels")
    if len(imgs) != len(labs):
        raise DataError(f"IDX images file {images_path} holds {len(imgs)} images but labels file "
                        f"{labels_path} holds {len(labs)} labels; expected the same count")
    images = (imgs.astype(np.float32) / 255.0)[:, None, :, :]
    labels = labs.astype(np.int64)
    return ImageDataset(images, labels, name, _class_names_for(labels), root=str(images_path.parent))


def load_bundled_mnist() -> ImageDataset:
    """The 10,000 MNIST training digits shipped inside the package (sorted by class)."""
    path = Path(__file__).parent / "mnist_subset.npz"
    if not path.is_file():
        raise DataError(f"bundled MNIST file {path} is missing; reinstall exhume")
    try:
        with np.load(path, allow_pickle=False) as npz:
            imgs, labs = npz["images"], npz["labels"]
    except (OSError, ValueError, KeyError, zlib.error, EOFError) as exc:
        raise DataError(f"bundled MNIST file {path} is unreadable: expected arrays 'images' and "
                        f"'labels' ({exc})") from None
    if imgs.ndim != 3 or imgs.dtype != np.uint8 or labs.shape != (imgs.shape[0],):
        raise DataError(f"bundled MNIST file {path}: expected uint8 images (N, 28, 28) and labels (N,), "
                        f"found {imgs.dtype} {imgs.shape} and {labs.shape}")
    images = (imgs.astype(np.float32) / 255.0)[:, None]
    return ImageDataset(images, labs.astype(np.int64), "mnist", list(MNIST_CLASSES))


def _find_idx_pair(root: Path, split: str, what: str) -> tuple[Path, Path]:
    prefix = "train" if split == "train" else "t10k"
    found = []
    for kind, nd in (("images", 3), ("labels", 1)):
        candidates = [root / f"{prefix}-{kind}-idx{nd}-ubyte{ext}" for ext in (".gz", "")]
        candidates.append(root / f"{prefix}-{kind}.idx{nd}-ubyte")
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            raise DataError(f"{what}: expected {candidates[1].name} or {candidates[0].name} in {root}, "
                            f"found neither")
        found.append(hit)
    return found[0], found[1]


def load_mnist_idx(root, split: str = "train") -> ImageDataset:
    """MNIST from the original IDX files (train-images-idx3-ubyte[.gz] etc.) in ``root``."""
    _check_split(split)
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"MNIST folder {root} does not exist")
    ds = load_idx(*_find_idx_pair(root, split, "MNIST"), name="mnist")
    ds.class_names, ds.root, ds.split = list(MNIST_CLASSES), str(root), split
    return ds


def load_fashion_mnist(root=None, split: str = "train") -> ImageDataset:
    """Fashion-MNIST IDX files; by default from Debian's ``dataset-fashion-mnist`` package."""
    _check_split(split)
    root = DEBIAN_FASHION_MNIST if root is None else Path(root)
    if not root.is_dir():
        raise DataError(f"Fashion-MNIST folder {root} does not exist: run "
                        f"`apt-get install dataset-fashion-mnist` (installs {DEBIAN_FASHION_MNIST}) "
                        f"or pass root= a folder holding {split if split == 'train' else 't10k'}"
                        f"-images-idx3-ubyte.gz and the labels file")
    ds = load_idx(*_find_idx_pair(root, split, "Fashion-MNIST"), name="fashion-mnist")
    ds.class_names, ds.root, ds.split = list(FASHION_CLASSES), str(root), split
    return ds


# ----------------------------------------------------------------------------------------- CIFAR-10

def _allowed_pickle_globals() -> dict:
    import _codecs
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    rec = multiarray._reconstruct
    return {("numpy.core.multiarray", "_reconstruct"): rec,
            ("numpy._core.multiarray", "_reconstruct"): rec,
            ("numpy", "ndarray"): np.ndarray,
            ("numpy", "dtype"): np.dtype,
            ("_codecs", "encode"): _codecs.encode}


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the few globals a CIFAR batch needs (numpy arrays)."""

    def __init__(self, file, source: str):
        super().__init__(file, encoding="bytes")
        self._source = source
        self._allowed = _allowed_pickle_globals()

    def find_class(self, module, name):
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise DataError(f"refusing to unpickle {module}.{name} from {self._source}: "
                            f"CIFAR batches contain only arrays") from None

    def persistent_load(self, pid):
        raise DataError(f"refusing persistent id in {self._source}: CIFAR batches contain only arrays")


def _unpickle_batch(raw: bytes, source: str):
    try:
        return _ArrayOnlyUnpickler(io.BytesIO(raw), source).load()
    except DataError:
        raise
    except Exception as exc:  # UnpicklingError, EOFError, ValueError, ... on corrupt input
        raise DataError(f"CIFAR batch {source} is truncated or corrupt: expected a pickled dict "
                        f"({type(exc).__name__}: {exc})") from None


def _get(d: dict, key: str):
    return d[key.encode()] if key.encode() in d else d.get(key)


def _batch_arrays(obj, source: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR batch {source}: expected a dict, found {type(obj).__name__}")
    data, labels = _get(obj, "data"), _get(obj, "labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        desc = f"{data.dtype} array {data.shape}" if isinstance(data, np.ndarray) else repr(type(data))
        raise DataError(f"CIFAR batch {source}: expected b'data' a uint8 array (N, 3072), found {desc}")
    if labels is None:
        raise DataError(f"CIFAR batch {source}: expected key b'labels', found keys {list(obj)}")
    try:
        labs = np.asarray(labels)
    except Exception:
        labs = np.array([])
    if labs.ndim != 1 or len(labs) != len(data) or labs.dtype.kind not in "iu":
        raise DataError(f"CIFAR batch {source}: expected b'labels' a list of {len(data)} ints, "
                        f"found {labs.dtype} of shape {labs.shape}")
    labs = labs.astype(np.int64)
    if labs.size and (labs.min() < 0 or labs.max() > 9):
        raise DataError(f"CIFAR batch {source}: expected labels in 0..9, found {labs.min()}..{labs.max()}")
    return data, labs


def _safe_member(name: str, archive: Path) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name or ":" in name:
        raise DataError(f"CIFAR archive {archive} has a member with an unsafe path {name!r}; refusing it")
    return p


def _read_cifar_files(path: Path, wanted: list[str]) -> dict[str, tuple[bytes, str]]:
    """Return {basename: (raw bytes, description)} for the wanted batch files (meta optional)."""
    out: dict[str, tuple[bytes, str]] = {}
    if path.is_dir():
        folder = path / "cifar-10-batches-py" if (path / "cifar-10-batches-py").is_dir() else path
        for fname in wanted:
            f = folder / fname
            if f.is_file():
                if f.stat().st_size > LIMITS.tar_member_bytes:
                    raise DataError(f"CIFAR batch {f}: {f.stat().st_size} bytes; expected at most {LIMITS.tar_member_bytes}")
                out[fname] = (f.read_bytes(), str(f))
        return out
    if not path.is_file():
        raise DataError(f"CIFAR-10 path {path} does not exist: expected cifar-10-python.tar.gz "
                        f"or the folder cifar-10-batches-py")
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:  # one member at a time: a huge member is refused before the next is read
                p = _safe_member(member.name, path)
                if p.name not in wanted or len(p.parts) > 2 or p.name in out:
                    continue
                if not member.isfile():
                    raise DataError(f"CIFAR archive {path}: member {member.name!r} is not a regular file")
                out[p.name] = (read_member(tf, member, path), f"{path}:{member.name}")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise DataError(f"CIFAR-10 file {path}: expected a (gzipped) tar archive, "
                        f"it is unreadable or truncated ({exc})") from None
    return out


def load_cifar10(path, split: str = "train") -> ImageDataset:
    """CIFAR-10 from ``cifar-10-python.tar.gz`` or the extracted ``cifar-10-batches-py`` folder."""
    _check_split(split)
    path = Path(path)
    batches = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    files = _read_cifar_files(path, batches + ["batches.meta"])
    missing = [b for b in batches if b not in files]
    if missing:
        raise DataError(f"CIFAR-10 at {path}: expected batch files {', '.join(batches)}, "
                        f"missing {', '.join(missing)}")
    datas, labels = [], []
    for b in batches:
        raw, source = files[b]
        d, lab = _batch_arrays(_unpickle_batch(raw, source), source)
        datas.append(d)
        labels.append(lab)
    class_names = list(CIFAR10_CLASSES)
    if "batches.meta" in files:
        raw, source = files["batches.meta"]
        meta = _unpickle_batch(raw, source)
        names = _get(meta, "label_names") if isinstance(meta, dict) else None
        if isinstance(names, list) and len(names) == 10:
            class_names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]
    data = np.concatenate(datas)
    images = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    return ImageDataset(images, np.concatenate(labels), "cifar10", class_names,
                        root=str(path), split=split)


# ------------------------------------------------------------------------------ digits and folders

def load_sklearn_digits() -> ImageDataset:
    """scikit-learn's bundled 1,797 8x8 digits, scaled from 0..16 to [0, 1], shape (N, 1, 8, 8)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("the 'digits' dataset needs scikit-learn: pip install exhume[sklearn]") from None
    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]
    return ImageDataset(images, np.asarray(bunch.target, dtype=np.int64), "digits", list(MNIST_CLASSES))


def _read_image(f: Path, budget: list[int]) -> np.ndarray:
    from PIL import UnidentifiedImageError
    try:
        with open_image_checked(f, budget) as im:
            im.load()
            if im.mode in ("1", "L", "LA", "I;16", "I;16B", "I;16L"):
                if im.mode.startswith("I;16"):
                    return np.asarray(im, dtype=np.float32)[None] / 65535.0
                return np.asarray(im.convert("L"), dtype=np.float32)[None] / 255.0
            return np.asarray(im.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"image {f} is unreadable: expected a PNG or JPEG file ({exc})") from None


def load_image_folder(path) -> ImageDataset:
    """One subfolder per class (sorted names -> ids 0, 1, ...), each holding PNG/JPEG images."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist: expected a folder with one subfolder per class")
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"image folder {root}: expected one subfolder per class, found none")
    arrays, labels, files = [], [], []
    budget = [LIMITS.folder_pixels]
    for cid, d in enumerate(classes):
        imgs = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in _IMAGE_SUFFIXES)
        if not imgs:
            raise DataError(f"class folder {d}: expected PNG/JPEG images, found none")
        for f in imgs:
            arrays.append(_read_image(f, budget))
            labels.append(cid)
            files.append(f)
    size = arrays[0].shape[1:]
    for a, f in zip(arrays, files):
        if a.shape[1:] != size:
            raise DataError(f"image {f} is {a.shape[2]}x{a.shape[1]} pixels (WxH); expected "
                            f"{size[1]}x{size[0]} like {files[0]} (all images must share one size)")
    if len({a.shape[0] for a in arrays}) > 1:  # mixed grey and colour: promote grey to RGB
        arrays = [np.repeat(a, 3, axis=0) if a.shape[0] == 1 else a for a in arrays]
    return ImageDataset(np.stack(arrays).astype(np.float32), np.asarray(labels, dtype=np.int64),
                        "folder", [d.name for d in classes], root=str(root))


# ------------------------------------------------------------------------------------- dispatcher

_ALIASES = {"fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "cifar-10": "cifar10",
            "cifar_10": "cifar10", "sklearn-digits": "digits", "image-folder": "folder"}


def load_dataset(name: str, root: str | None = None, split: str = "train") -> ImageDataset:
    """Load a dataset by name: mnist, fashion-mnist, cifar10, digits or folder."""
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in DATASET_NAMES:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASET_NAMES)}")
    _check_split(split)
    if key == "mnist":
        if root is not None:
            return load_mnist_idx(root, split)
        if split != "train":
            raise ConfigError("the bundled MNIST subset has only training digits; pass root= a folder "
                              "with t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz for split='test'")
        return load_bundled_mnist()
    if key == "fashion-mnist":
        return load_fashion_mnist(root, split)
    if key in ("cifar10", "folder") and root is None:
        raise ConfigError(f"dataset {key!r} needs root= (" + (
            "cifar-10-python.tar.gz or the cifar-10-batches-py folder)" if key == "cifar10"
            else "a folder with one subfolder of images per class)"))
    if key == "cifar10":
        return load_cifar10(root, split)
    if split != "train":
        raise ConfigError(f"dataset {key!r} has no {split!r} split; use split='train' and a disjoint pool")
    return load_sklearn_digits() if key == "digits" else load_image_folder(root)
