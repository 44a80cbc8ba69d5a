"""Records an informed adversary holds besides the weights (docs/METHODS.md §7): training records it knows
(``known_records``), or the candidate game's k candidates (``candidates``), each an ``.npz`` of ``x`` (display
space) and ``y`` or a pair ``(x, y)``; binary labels ±1 (0/1 read as −1/+1), class ids, regression targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exhume.errors import ConfigError


@dataclass(frozen=True)
class Records:
    """Records in display space: images ``x`` ``(k, C, H, W)`` float32 and labels ``y`` in the victim's convention."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def without(self, index: int) -> Records:
        """These records less the one at ``index``."""
        keep = [i for i in range(len(self)) if i != index]
        return Records(self.x[keep], self.y[keep])


def records_of(value: Any, input_shape: tuple[int, ...], task: str, what: str) -> Records:
    """``value`` (a :class:`Records`, an ``.npz`` path or a pair ``(x, y)``) as checked :class:`Records`."""
    from exhume.files.binary import read_npz_arrays

    if isinstance(value, Records):
        x, y = value.x, value.y
    elif isinstance(value, (str, PathLike)):
        arrays = read_npz_arrays(Path(value), ("x", "y"), what, ConfigError)
        x, y = arrays["x"], arrays["y"]
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        x, y = value
    else:
        raise ConfigError(f"{what} must be an .npz file (x: images, y: labels) or a pair (x, y), got {type(value).__name__}")
    x = _images(x, input_shape, what)
    return Records(x, _labels(y, x.shape[0], task, what))


def _images(x: Any, input_shape: tuple[int, ...], what: str) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x))
    if x.dtype == torch.uint8:
        x = x.float() / 255.0
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise ConfigError(f"{what}: images of dtype {x.dtype}; expected floats in [0, 1] or uint8")
    x = x.float()
    if x.dim() == len(input_shape):  # (k, H, W) for one channel
        x = x.unsqueeze(1)
    if x.dim() != len(input_shape) + 1 or tuple(x.shape[1:]) != tuple(input_shape) or x.shape[0] < 1:
        raise ConfigError(f"{what}: images of shape {tuple(x.shape)}; expected (k ≥ 1, {', '.join(map(str, input_shape))})")
    if not torch.isfinite(x).all() or float(x.min()) < -1e-6 or float(x.max()) > 1 + 1e-6:
        raise ConfigError(f"{what}: pixel values must be finite and in [0, 1] (display space, before normalisation)")
    return x.contiguous()


def _labels(y: Any, k: int, task: str, what: str) -> torch.Tensor:
    y = torch.as_tensor(np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y)).reshape(-1)
    if y.shape[0] != k:
        raise ConfigError(f"{what}: {k} images but {y.shape[0]} labels; expected one label per image")
    if task == "binary":
        values = set(y.double().unique().tolist())
        if not values <= {-1.0, 1.0} and not values <= {0.0, 1.0}:
            raise ConfigError(f"{what}: binary labels must be ±1 or 0/1, got {sorted(values)}")
        return torch.where(y.double() > 0, 1.0, -1.0).float()
    if task == "multiclass":
        if y.is_floating_point() and not torch.equal(y, y.round()):
            raise ConfigError(f"{what}: multiclass labels must be integer class ids")
        return y.long()
    return y.float()
