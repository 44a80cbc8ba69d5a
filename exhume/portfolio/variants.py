"""Which restarts a portfolio runs: the variants each attack declares, and the default number of restarts.

Restart ``k`` runs with seed ``seed + k`` and the overrides ``variants[k % len]`` of the attack's
:class:`~exhume.attacks.engine.base.RestartPlan` on top of the caller's keyword arguments, so restart 0 is
always the caller's own settings. An attack that declares no plan runs once by default, and its
restarts, when asked for, differ by seed only.

Default variants apply only to what the caller left unset: a parameter the caller passed keeps the
caller's value on every restart (an explicit ``variants=`` list overrides as given).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from exhume.attacks import ATTACKS, RestartPlan

# Seconds one restart should get before a further restart pays more than a longer run, for an
# attack whose plan does not say: where a kkt run on the demo victim plateaus
# (docs/defaults.md#portfolio-seconds-per-restart).
SECONDS_PER_RESTART = 45.0
MAX_AUTO_RESTARTS = 64


def restart_plan(method: str) -> RestartPlan:
    """The restart plan ``method`` declares, or the plain one (restarts differ by seed only)."""
    cls = ATTACKS.get(method)
    plan = None if cls is None else cls.restart_plan
    return plan if plan is not None else RestartPlan()


def seconds_per_restart(method: str) -> float:
    """What one restart of ``method`` should get (its plan's, else :data:`SECONDS_PER_RESTART`)."""
    return restart_plan(method).seconds_per_restart or SECONDS_PER_RESTART


def has_plan(method: str) -> bool:
    """Whether ``exhume attack`` runs a portfolio for ``method`` by default (the attack declares a restart plan)."""
    cls = ATTACKS.get(method)
    return cls is not None and cls.restart_plan is not None


def variants_for(method: str, fixed: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``method``'s default variants, less every parameter in ``fixed`` (the ones the caller set; given as the caller's
    settings, those of the ``preset`` among them count as set too)."""
    cls = ATTACKS.get(method)
    if cls is not None and isinstance(fixed, Mapping):
        fixed = cls.with_preset(fixed.get("preset"), {k: v for k, v in fixed.items() if k != "preset"})
    fixed = set(fixed)
    return [{k: v for k, v in var.items() if k not in fixed} for var in restart_plan(method).variants]


class _DeclaredVariants(Mapping):
    """``{method: variants}`` of every registered attack that declares a restart plan, read when asked."""

    def _plans(self) -> dict[str, list[dict[str, Any]]]:
        return {name: [dict(v) for v in cls.restart_plan.variants] for name, cls in ATTACKS.items() if cls.restart_plan}

    def __getitem__(self, method: str) -> list[dict[str, Any]]:
        return self._plans()[method]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plans())

    def __len__(self) -> int:
        return len(self._plans())


DEFAULT_VARIANTS: Mapping[str, list[dict[str, Any]]] = _DeclaredVariants()


def default_restarts(budget_seconds: float | None, workers: int, seconds_per_restart: float | None = None) -> int:
    """How many restarts ``restarts="auto"`` runs: one wave per worker, more waves for longer budgets.

    Without a time budget (an iteration budget per restart), one restart per worker. With one, as
    many waves as fit ``seconds_per_restart`` (default :data:`SECONDS_PER_RESTART`) each (at least
    one), times the number of workers.
    """
    workers = max(1, int(workers))
    if budget_seconds is None:
        return min(workers, MAX_AUTO_RESTARTS)
    waves = max(1, math.floor(float(budget_seconds) / (seconds_per_restart or SECONDS_PER_RESTART)))
    return max(1, min(workers * waves, MAX_AUTO_RESTARTS))
