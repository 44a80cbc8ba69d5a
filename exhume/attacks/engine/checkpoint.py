"""Checkpoints for long attacks: tensors, optimiser states and progress, loaded safely.

Written and read through :mod:`exhume.files.torchfile`: ``torch.save`` to a temporary file renamed
into place (an interrupted or failed write never leaves a corrupt checkpoint nor a stray temporary
file), ``torch.load(weights_only=True)`` under a size limit, so a checkpoint can hold tensors,
numbers, strings, lists and dicts but never executes code. Its structure is checked by :func:`exhume.files.schemas.check_checkpoint`.

A :class:`RunOwner` (given by :func:`exhume.attack` to the run it makes) stamps every checkpoint with the victim's
weight fingerprint and bounds the iteration a resumed checkpoint may claim; a checkpoint written for
another victim is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exhume.errors import ExhumeError
from exhume.files.schemas import check_checkpoint
from exhume.files.torchfile import expected_limit, load_torch, save_torch, state_bytes


@dataclass(frozen=True)
class RunOwner:
    """Whose run a checkpoint is: ``victim``, the weights' fingerprint it is stamped with (a resume for other weights is
    refused), and ``max_iteration``, the most iterations a resumed checkpoint may claim (its run's step budget)."""

    victim: str
    max_iteration: int | None = None


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor], optimizers: dict[str, torch.optim.Optimizer], state: dict[str, Any],
                    owner: RunOwner | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "tensors": {k: v.detach().cpu() for k, v in tensors.items()},
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
        "state": state,
        "victim": None if owner is None else owner.victim,
    }
    save_torch(path, payload)


def load_checkpoint(path: Path, tensors: dict[str, torch.Tensor], optimizers: dict[str, torch.optim.Optimizer], expect: dict[str, Any],
                    defaults: dict[str, Any] | None = None, retired: dict[str, tuple[Any, ...]] | None = None,
                    owner: RunOwner | None = None) -> dict[str, Any]:
    """Restore ``tensors`` and ``optimizers`` in place; returns the saved progress state.

    ``expect`` lists settings that must match the checkpoint's (resuming with other settings
    would silently mix two runs). ``defaults``: the attack's setting defaults; a setting missing
    from a checkpoint's ``config`` (one added to exhume after the checkpoint was written) counts as
    its default, since a new setting's default keeps the behaviour the older run had. ``retired``: settings the
    attack no longer has, with the values under which the older run did what this one does; a checkpoint that
    recorded one of them with another value is refused; one of :data:`PLUMBING` is never compared. ``owner``: whose
    run it must be (:class:`RunOwner`; None: anyone's).
    """
    payload = load_torch(path, "cannot resume", "exhume checkpoint", limit=expected_limit(state_bytes(tensors, optimizers)))
    state = check_checkpoint(payload, f"checkpoint {path}", tensors, optimizers, None if owner is None else owner.max_iteration)
    if owner is not None and payload.get("victim") != owner.victim:
        raise ExhumeError(f"cannot resume from {path}: it was written for another victim (weights fingerprint "
                          f"{payload.get('victim')!r}, this victim's is {owner.victim!r}); use a new output folder")
    for key, value in expect.items():
        saved = state.get(key)
        if key == "config" and isinstance(saved, dict) and isinstance(value, dict):
            saved = {**{k: v for k, v in (defaults or {}).items() if k in value}, **saved}
            gone = retired or {}
            saved = {k: v for k, v in saved.items() if k not in PLUMBING and (k in value or k not in gone or v not in gone[k])}
        if saved != value:
            if isinstance(saved, dict) and isinstance(value, dict):  # name the settings that differ, not the whole dicts
                diff = sorted(set(saved) | set(value), key=str)
                shown = ", ".join(f"{k}={saved.get(k, '(unset)')!r} there, {value.get(k, '(unset)')!r} here"
                                  for k in diff if saved.get(k, "(unset)") != value.get(k, "(unset)"))
            else:
                shown = f"{key}={saved!r} there, {value!r} here"
            raise ExhumeError(f"cannot resume from {path}: it was written with other settings ({shown}); "
                              "use the same settings or a new output folder")
    with torch.no_grad():
        for k, t in tensors.items():
            saved = payload["tensors"][k]
            if saved.shape != t.shape:
                raise ExhumeError(f"cannot resume from {path}: {k} has shape {tuple(saved.shape)}, expected {tuple(t.shape)}")
            t.copy_(saved.to(t.dtype))
    for k, o in optimizers.items():
        try:
            o.load_state_dict(payload["optimizers"][k])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ExhumeError(f"cannot resume from {path}: optimiser state {k!r} does not fit this run ({e})") from None
    return state


#: how a run was bounded and how often it recorded itself, never what it computed: settings of the attacks once (now the
#: run's deadline and Attack.run's keywords), which a checkpoint that recorded them resumes with whatever their value
PLUMBING = ("max_seconds", "checkpoint_every", "log_every")
#: the settings a resumed run may change: its step budget
BUDGET_SETTINGS = ("iterations",)


def resumable_settings(cfg: dict[str, Any], budget: tuple[str, ...] = BUDGET_SETTINGS) -> dict[str, Any]:
    """The settings a resumed run must share with its checkpoint (``budget`` keys may change)."""
    return {k: v for k, v in cfg.items() if k not in budget}
