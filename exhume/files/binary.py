"""Binary inputs read with their declared sizes checked first: gzip/IDX, .npy, tar members, images.

Nothing is allocated from a size the file merely claims: an IDX header's dimensions give the
exact byte count the (streamed) decompression may produce, a tar member's header its size, an
image's header its pixel count, a .npy header its shape — each checked against
:data:`~exhume.files.limits.LIMITS` and the bytes actually present.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from exhume.errors import DataError, ExhumeError
from exhume.files.limits import LIMITS


def _read_exact(fh: IO[bytes], n: int) -> bytes:
    """At most ``n`` bytes (streamed in 1 MiB chunks; a gzip stream is never inflated past ``n``)."""
    chunks, got = [], 0
    while got < n:
        chunk = fh.read(min(1 << 20, n - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_idx(path: Path, magic: int, what: str) -> np.ndarray:
    """An IDX file (gzipped or not) whose header dimensions bound everything read after it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {path} does not exist (or is not a file)")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            fh = gzip.GzipFile(fileobj=raw) if gz else raw
            head = _read_exact(fh, header)
            if len(head) < header:
                raise DataError(f"{what} file {path}: expected an IDX header of {header} bytes, got only {len(head)} bytes")
            (found,) = struct.unpack(">I", head[:4])
            if found != magic:
                raise DataError(f"{what} file {path}: expected IDX magic number 0x{magic:08x} "
                                f"(uint8, {ndim} dimensions), found 0x{found:08x}")
            dims = struct.unpack(f">{ndim}I", head[4:header])
            expected = math.prod(dims)
            if expected > LIMITS.idx_bytes:
                raise DataError(f"{what} file {path}: header dims {dims} declare {expected} bytes; "
                                f"expected at most {LIMITS.idx_bytes}")
            data = _read_exact(fh, expected + 1)  # one byte more reveals trailing data
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{what} file {path} is a truncated or corrupt gzip file: {exc}") from None
    if len(data) != expected:
        kind = "truncated" if len(data) < expected else "has trailing data"
        raise DataError(f"{what} file {path} {kind}: header dims {dims} need expected {expected} bytes of data, "
                        f"got {len(data) if len(data) < expected else 'more'}")
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def read_npy_indices(path: Path, error: type[ExhumeError] = DataError) -> np.ndarray:
    """A 1-D integer ``.npy`` array (train_indices.npy), its header checked before the data is read."""
    fmt = np.lib.format
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            version = fmt.read_magic(fh)
            reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _fortran, dtype = reader(fh, max_header_size=LIMITS.npy_header_bytes)
            if len(shape) != 1 or dtype.kind not in "iu" or dtype.hasobject:
                raise error(f"{path}: expected a 1-D integer array, found {dtype} of shape {shape}")
            if shape[0] > LIMITS.npy_items or shape[0] * dtype.itemsize > size - fh.tell():
                raise error(f"{path}: header declares {shape[0]} items of {dtype}; the file holds "
                            f"{size - fh.tell()} bytes of data (at most {LIMITS.npy_items} items allowed)")
            data = np.fromfile(fh, dtype=dtype, count=shape[0])
    except ExhumeError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise error(f"{path} is not a readable .npy file: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if len(data) != shape[0]:
        raise error(f"{path} is truncated: expected {shape[0]} items, found {len(data)}")
    if data.size and data.min() < 0:
        raise error(f"{path}: expected non-negative indices, found {int(data.min())}")
    return data.astype(np.int64)


def check_tar_member(member, archive: Path) -> None:
    """Refuse a member whose declared size is beyond the limit (before it is inflated)."""
    if member.size > LIMITS.tar_member_bytes:
        raise DataError(f"archive {archive}: member {member.name!r} declares {member.size} bytes; "
                        f"expected at most {LIMITS.tar_member_bytes}")


def read_member(tf, member, archive: Path) -> bytes:
    check_tar_member(member, archive)
    fh = tf.extractfile(member)
    data = _read_exact(fh, member.size + 1)
    if len(data) != member.size:
        raise DataError(f"archive {archive}: member {member.name!r} holds {len(data)} bytes, its header says {member.size}")
    return data


def open_image_checked(f: Path, budget: list[int]):
    """Open an image lazily and check its header's size before any pixel is decoded.

    ``budget`` is a one-item list of the pixels still allowed for the whole folder (decremented).
    """
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():  # the size check below gives the one message
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(f)
    except Image.DecompressionBombError:
        raise DataError(f"image {f}: its header declares more pixels than Pillow allows; "
                        f"expected at most {LIMITS.image_pixels} pixels") from None
    w, h = im.size
    channels = len(im.getbands())
    if w * h > LIMITS.image_pixels:
        im.close()
        raise DataError(f"image {f}: {w}x{h} pixels (from its header); expected at most {LIMITS.image_pixels} pixels")
    budget[0] -= w * h * channels
    if budget[0] < 0:
        im.close()
        raise DataError(f"image folder: the images up to {f} hold more than {LIMITS.folder_pixels} numbers; expected a smaller folder")
    return im


def read_npz_arrays(path: Path, names: tuple[str, ...], what: str, error: type[ExhumeError] = DataError) -> dict[str, np.ndarray]:
    """The arrays ``names`` of an ``.npz`` of plain arrays (never unpickled), the file's size checked first; a missing
    array, or a file that is not one, is one line."""
    import zipfile

    try:
        if path.stat().st_size > LIMITS.npz_bytes:
            raise error(f"{what} {path} holds {path.stat().st_size} bytes; at most {LIMITS.npz_bytes} are read")
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in names if k not in npz.files]
            if missing:
                raise error(f"{what} {path} has no array {', '.join(map(repr, missing))} (found: {', '.join(sorted(npz.files)) or 'none'}); "
                            f"save it with np.savez(PATH, {', '.join(f'{k}=...' for k in names)})")
            return {k: np.asarray(npz[k]) for k in names}
    except ExhumeError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise error(f"{what} {path} is not a readable .npz of plain arrays ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
