"""The plan of a portfolio: which restarts run, each with its seed, variant and budget.

A restart is one run of a registered attack from one seed (the attack knows nothing of the
portfolio). Restart ``k`` gets seed ``seed + k`` and the variant ``variants[k % len(variants)]``
(parameter overrides applied last); a time budget ``max_seconds`` for the whole portfolio is
split into waves of ``workers`` restarts running side by side, so each restart gets at most
``max_seconds / waves`` seconds (``Restart.seconds``; locally it also ends with its wave, before the
portfolio's deadline). An iteration budget (``iterations=``) applies to each restart as
it is: the same seed and iteration counts give the same candidates.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from exhume.errors import ConfigError
from exhume.params import parse_restarts
from exhume.portfolio.variants import default_restarts, seconds_per_restart, variants_for

MAX_DEFAULT_WORKERS = 8


@dataclass(frozen=True)
class Restart:
    index: int
    seed: int
    overrides: dict[str, Any]  # the variant: what differs from the caller's settings
    kwargs: dict[str, Any] = field(default_factory=dict)  # every keyword argument of the attack
    seconds: float | None = None  # its share of the portfolio's seconds (None: its iterations alone bound it)

    def record(self) -> dict[str, Any]:
        return {"restart": self.index, "seed": self.seed, "overrides": self.overrides, "kwargs": self.kwargs,
                "seconds": self.seconds}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Restart:
        """The inverse of :meth:`record`; a record written when the seconds were an attack setting (``kwargs``'
        ``max_seconds``) reads as the same restart."""
        kwargs = dict(rec["kwargs"])
        seconds = rec.get("seconds", kwargs.pop("max_seconds", None))
        return cls(int(rec["restart"]), int(rec["seed"]), dict(rec["overrides"]), kwargs, seconds)


@dataclass(frozen=True)
class Plan:
    method: str
    restarts: tuple[Restart, ...]
    seed: int
    max_seconds: float | None
    workers: int
    every: tuple[int | None, int | None] = (None, None)  # each restart's (checkpoint_every, log_every); None: the attack's

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "seed": self.seed, "max_seconds": self.max_seconds, "workers": self.workers,
                "checkpoint_every": self.every[0], "log_every": self.every[1], "restarts": [r.record() for r in self.restarts]}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Plan:
        return cls(rec["method"], tuple(Restart.from_record(r) for r in rec["restarts"]), int(rec["seed"]),
                   rec.get("max_seconds"), int(rec.get("workers", 1)), (rec.get("checkpoint_every"), rec.get("log_every")))

    def key(self) -> str:
        """What must match for two runs to share results (workers may differ)."""
        return json.dumps({"method": self.method, "restarts": [r.record() for r in self.restarts]}, sort_keys=True, default=str)


def local_cores() -> int:
    """The cores this process may use (``os.sched_getaffinity`` where it exists)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_workers() -> int:
    """The local cores, at most 8."""
    return min(local_cores(), MAX_DEFAULT_WORKERS)


def resolve_restarts(restarts: int | str | None, max_seconds: float | None, workers: int,
                     per_restart: float | None = None) -> int:
    restarts = parse_restarts(restarts)
    return default_restarts(max_seconds, workers, per_restart) if restarts in (None, "auto") else restarts


def make_plan(method: str, restarts: int | str | None, *, seed: int = 0, max_seconds: float | None = None,
              workers: int | None = None, variants: list[dict[str, Any]] | None = None,
              attack_kwargs: dict[str, Any] | None = None, every: tuple[int | None, int | None] = (None, None)) -> Plan:
    """The restarts of a portfolio; every restart's keyword arguments are validated here (``every``: each restart's
    ``(checkpoint_every, log_every)``)."""
    from exhume.attacks import get_attack

    workers = default_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be a positive integer, got {workers!r}")
    if max_seconds is not None and not (isinstance(max_seconds, (int, float)) and max_seconds > 0 and math.isfinite(max_seconds)):
        raise ConfigError(f"max_seconds must be a positive number of seconds, got {max_seconds!r}")
    base = dict(attack_kwargs or {})
    n = resolve_restarts(restarts, max_seconds, workers, seconds_per_restart(method))
    # the default variants never override what the caller set; an explicit list does
    variants = variants_for(method, fixed=base) if variants is None else [dict(v) for v in variants]
    if not variants or not all(isinstance(v, dict) for v in variants):
        raise ConfigError(f"variants must be a non-empty list of dicts of {method} parameters, got {variants!r}")
    waves = math.ceil(n / min(workers, n))
    per = None if max_seconds is None else round(float(max_seconds) / waves, 3)
    plan = []
    for k in range(n):
        over = variants[k % len(variants)]
        kwargs = {**base, **over}
        get_attack(method, **kwargs)  # an invalid variant or setting fails here, before anything runs
        plan.append(Restart(k, int(seed) + k, over, kwargs, per))
    return Plan(method, tuple(plan), int(seed), None if max_seconds is None else float(max_seconds), workers, tuple(every))


DEFAULT_STUDY = "exhume-portfolio"

