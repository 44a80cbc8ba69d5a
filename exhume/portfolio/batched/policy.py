"""Whether a portfolio's restarts run batched (:func:`use_batched`), and which restarts share a batch (:func:`groups`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exhume.attacks import ATTACKS
from exhume.choices import BATCH_CHOICES
from exhume.errors import ConfigError
from exhume.portfolio.plan import Restart

#: settings restarts of one batch may differ in: they touch only each restart's optimisers
PER_RESTART = ("lr", "lr_lambda")


def use_batched(setting: str, device: str, method: str, storage: str | None,
                unbatched: Callable[[], str | None] | None = None) -> tuple[bool, str]:
    """``(batched?, why)`` for ``batch_restarts=setting``; 'on' where it cannot apply is one clear error. ``unbatched()``:
    why this attack's runs on this victim have no batched path (:meth:`~exhume.attacks.engine.base.Attack.unbatched_on`), asked
    only where batching would otherwise be chosen."""
    if setting not in BATCH_CHOICES:
        raise ConfigError(f"batch_restarts must be one of {', '.join(BATCH_CHOICES)}, got {setting!r}")
    batchable = sorted(name for name, cls in ATTACKS.items() if cls.batchable)
    cannot = (f"the {method} attack has no batched path (only {', '.join(batchable)})" if method not in batchable
              else "a shared study (storage) runs its restarts one per process, on any machine" if storage is not None else None)
    if setting == "off":
        return False, "batch_restarts='off'"
    if not cannot and unbatched is not None and (setting == "on" or torch.device(device).type == "cuda"):
        cannot = unbatched()
    if setting == "on":
        if cannot:
            raise ConfigError(f"batch_restarts='on' cannot apply: {cannot}; use 'auto' or 'off'")
        return True, "asked for (batch_restarts='on')"
    if cannot:
        return False, cannot
    if torch.device(device).type == "cuda":
        return True, "auto: a CUDA device is filled by one batched process"
    return False, "auto: on CPU, one forked worker per core"


@dataclass
class Batching:
    """The path a portfolio's local restarts take (:func:`use_batched`) and, when batched, each group's record."""

    used: bool
    why: str
    groups: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"used": self.used, "why": self.why, **({"groups": self.groups} if self.groups else {})}


def batch_key(restart: Restart) -> str:
    """What must be equal for two restarts to share a batch (their settings less :data:`PER_RESTART`)."""
    return json.dumps({k: v for k, v in restart.kwargs.items() if k not in PER_RESTART}, sort_keys=True, default=str)


def groups(pending: list[Restart], capacity: int | None = None) -> list[list[Restart]]:
    """The pending restarts grouped by :func:`batch_key`, in order of their first restart, each group cut into
    batches of at most ``capacity`` restarts (None: no limit)."""
    out: dict[str, list[Restart]] = {}
    for r in pending:
        out.setdefault(batch_key(r), []).append(r)
    size = max(1, capacity or len(pending) or 1)
    return [g[i:i + size] for g in out.values() for i in range(0, len(g), size)]


def capacity(view, method: str, restart: Restart, device: str) -> int | None:
    """How many restarts one batch may hold: the memory available on ``device`` over one restart's estimated peak
    (:mod:`exhume.attacks.engine.memory`; conservative, the set-up's peak is counted in every restart); None when unknown."""
    from exhume.attacks import get_attack
    from exhume.attacks.engine.memory import available_bytes

    need = get_attack(method, **restart.kwargs).peak_memory_bytes(view)
    room = available_bytes(device)
    return None if not need or room is None else max(1, room // need)
