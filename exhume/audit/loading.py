"""Reading what a user brings to an audit: their model class, their weights, their images.

- model: ``path/to/file.py:ClassName`` or ``package.module:ClassName``, built with keyword
  arguments. Importing the file runs the user's own code, at their request (it is their model).
- weights: ``.safetensors``, or a ``.pt``/``.pth``/``.bin`` state dict read with
  ``torch.load(weights_only=True)``. A whole pickled module is refused, never unpickled.
- images: an ``.npz`` with ``x`` (and ``y``), a folder with one subfolder of images per class, or
  an IDX images file (its labels file found by name) or a folder holding one IDX pair.

Every problem is one :class:`~exhume.errors.ExhumeError` naming the file and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from exhume.errors import ConfigError, DataError, VictimError
from exhume.files.weights import read_tensors


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _import_target(spec: str):
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(f"--model {spec!r}: expected path/to/file.py:ClassName or package.module:ClassName")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"model file {path} does not exist; expected the .py file that defines class {name}")
        mod_name = f"exhume_user_model_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(mod_name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ConfigError(f"model file {path} cannot be imported; expected a Python source file")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))  # the file may import its neighbours
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:  # the user's own code failed: say where, in one line
            raise ConfigError(f"importing model file {path} failed ({_one_line(e)}); fix that file") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
        source = str(path)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:
            raise ConfigError(f"cannot import module {where!r} for --model {spec!r} ({_one_line(e)}); is it on PYTHONPATH?") from None
        source = where
    cls = getattr(module, name, None)
    if cls is None:
        found = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise ConfigError(f"{source} defines no class {name!r}; nn.Module classes found there: {', '.join(found) or 'none'}")
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise ConfigError(f"{source}:{name} is not a torch.nn.Module subclass")
    return cls, source


def load_model_class(spec: str, model_args: dict[str, Any] | None = None) -> nn.Module:
    """Build ``ClassName(**model_args)`` from ``path/to/file.py:ClassName`` or ``package.module:ClassName``."""
    cls, source = _import_target(spec)
    kwargs = dict(model_args or {})
    try:
        return cls(**kwargs)
    except Exception as e:
        raise ConfigError(f"{source}: {cls.__name__}(**{kwargs}) failed ({_one_line(e)}); pass its constructor "
                          "arguments with --model-args '{\"name\": value}' or [model_args] in the config") from None


def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Load ``path`` into ``model`` (strict: every name and shape must match), as float32 in eval mode."""
    path = Path(path)
    tensors = read_tensors(path, "weights file")
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise VictimError(f"weights file {path} does not fit {type(model).__name__}: missing {missing[:5]}, unexpected {extra[:5]}; "
                          "check --model and --model-args (the class and widths the weights were saved from)")
    for k, v in expected.items():
        if tuple(v.shape) != tuple(tensors[k].shape):
            raise VictimError(f"weights file {path}: {k} has shape {tuple(tensors[k].shape)} but {type(model).__name__} "
                              f"expects {tuple(v.shape)}; check --model-args (layer widths)")
    model.load_state_dict(tensors)
    from exhume.victim.victim import check_finite

    check_finite(model, f"weights file {path}")
    return model.float().eval()


def as_images(x: Any, source: str) -> np.ndarray:
    """``x`` as float32 ``(N, C, H, W)`` in [0, 1]: uint8 is divided by 255; (N, H, W) and (N, H, W, C) accepted."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"{source}: images have dtype {x.dtype}; expected uint8 (0..255) or floats in [0, 1]")
    x = x.astype(np.float32)
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.ndim != 4 or x.shape[0] == 0:
        raise DataError(f"{source}: images have shape {x.shape}; expected (N, H, W), (N, C, H, W) or (N, H, W, C) with N > 0")
    if not np.isfinite(x).all():
        raise DataError(f"{source}: images contain NaN or inf")
    lo, hi = float(x.min()), float(x.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise DataError(f"{source}: pixel values range over [{lo:.3g}, {hi:.3g}]; expected raw images in [0, 1] "
                        "(floats) or 0..255 (uint8), before normalisation (state that with --normalize MEAN,STD)")
    return np.ascontiguousarray(x)


def _load_npz(path: Path, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            if "x" not in keys:
                raise DataError(f"{path} has no array 'x' (found: {', '.join(sorted(keys)) or 'none'}); "
                                "save it with np.savez(PATH, x=images, y=labels)")
            x, y = npz["x"], (npz["y"] if "y" in keys else None)
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{path} is not a readable .npz of plain arrays ({_one_line(e)}); save it with np.savez(PATH, x=images, y=labels)") from None
    if need_labels and y is None:
        raise DataError(f"{path} has no array 'y' (the labels); save it with np.savez(PATH, x=images, y=labels)")
    return x, y


def _idx_pair(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        imgs = sorted(p for p in path.iterdir() if "images" in p.name and "idx3" in p.name)
        if len(imgs) != 1:
            raise DataError(f"{path}: expected one subfolder per class, or exactly one IDX images file (…images-idx3-ubyte[.gz]); "
                            f"found {len(imgs)} IDX images files")
        path = imgs[0]
    labels = path.with_name(path.name.replace("images", "labels").replace("idx3", "idx1"))
    if labels == path or not labels.is_file():
        raise DataError(f"IDX images file {path}: its labels file {labels.name} is missing next to it")
    return path, labels


def load_images(path: str | Path, need_labels: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Images ``(N, C, H, W)`` float32 in [0, 1] and labels (int64, or None) from an .npz, image folder or IDX file."""
    from exhume.data import load_idx, load_image_folder

    path = Path(path)
    if not path.exists():
        raise DataError(f"data {path} does not exist; expected an .npz with x and y, a folder with one subfolder per class, or IDX files")
    if path.suffix == ".npz":
        x, y = _load_npz(path, need_labels)
    elif path.is_dir() and any(d.is_dir() and not d.name.startswith(".") for d in path.iterdir()):
        ds = load_image_folder(path)
        names = ds.class_names
        ids = [int(n) for n in names] if all(n.lstrip("-").isdigit() for n in names) else list(range(len(names)))
        x, y = ds.images, np.asarray(ids, dtype=np.int64)[ds.labels]
    elif path.is_dir() or "idx" in path.name:
        ds = load_idx(*_idx_pair(path))
        x, y = ds.images, ds.labels
    else:
        raise DataError(f"data {path}: unknown format; expected an .npz with x and y, a folder with one subfolder per class, or IDX files")
    x = as_images(x, str(path))
    if y is not None:
        y = np.asarray(y).reshape(-1)
        if y.shape[0] != x.shape[0]:
            raise DataError(f"{path}: {x.shape[0]} images but {y.shape[0]} labels; expected one label per image")
        if not np.issubdtype(y.dtype, np.integer) and not (np.issubdtype(y.dtype, np.floating) and np.all(y == np.round(y))):
            raise DataError(f"{path}: labels have dtype {y.dtype}; expected integer class ids")
        y = y.astype(np.int64)
    return x, y
