"""Checkpoints for long attacks: tensors, optimiser states and progress, loaded safely.

Written with ``torch.save`` to a temporary file and renamed into place (an interrupted write
never leaves a corrupt checkpoint); read with ``torch.load(weights_only=True)``, so a checkpoint
can hold tensors, numbers, strings, lists and dicts but never executes code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from exhume.errors import ExhumeError


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor], optimizers: dict[str, torch.optim.Optimizer], state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "tensors": {k: v.detach().cpu() for k, v in tensors.items()},
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "state": state,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, tensors: dict[str, torch.Tensor], optimizers: dict[str, torch.optim.Optimizer], expect: dict[str, Any]) -> dict[str, Any]:
    """Restore ``tensors`` and ``optimizers`` in place; returns the saved progress state.

    ``expect`` lists settings that must match the checkpoint's (resuming with other settings
    would silently mix two runs).
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to read is the same user-facing problem
        raise ExhumeError(f"cannot resume from {path}: not a readable exhume checkpoint ({type(e).__name__}: {e})") from None
    state = payload.get("state", {})
    for key, value in expect.items():
        if state.get(key) != value:
            raise ExhumeError(
                f"cannot resume from {path}: it was written with {key}={state.get(key)!r}, this run has {key}={value!r}; "
                "use the same settings or a new output folder"
            )
    with torch.no_grad():
        for k, t in tensors.items():
            saved = payload["tensors"][k]
            if saved.shape != t.shape:
                raise ExhumeError(f"cannot resume from {path}: {k} has shape {tuple(saved.shape)}, expected {tuple(t.shape)}")
            t.copy_(saved.to(t.dtype))
    for k, o in optimizers.items():
        o.load_state_dict(payload["optimizers"][k])
    return state


BUDGET_SETTINGS = ("iterations", "max_seconds", "checkpoint_every", "log_every")


def resumable_settings(cfg: dict[str, Any], budget: tuple[str, ...] = BUDGET_SETTINGS) -> dict[str, Any]:
    """The settings a resumed run must share with its checkpoint (``budget`` keys may change)."""
    return {k: v for k, v in cfg.items() if k not in budget}
