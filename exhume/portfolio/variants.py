"""Which restarts a portfolio runs: the variant list per attack and the default number of restarts.

Restart ``k`` runs with seed ``seed + k`` and the overrides ``DEFAULT_VARIANTS[method][k % len]``
on top of the caller's keyword arguments, so restart 0 is always the caller's own settings.

Default variants apply only to what the caller left unset: a parameter the caller passed keeps the
caller's value on every restart (an explicit ``variants=`` list overrides as given).

kkt's restarts alternate the learning rate of the multipliers, ``lr_lambda`` 1e-4 (kkt's default
for classifiers, which restart 0 and a portfolio of one take) and 1e-2, each with kkt's other
defaults (:mod:`exhume.attacks.kkt`; for regression both are 1e-2). Why: the equation of a
homogeneous network does not fix the multipliers' scale; learned fast, it drifts on some victims
and must move on others, so the alternation hedges. Variants of the λ scale and of α were measured
and did not pay; the optimiser was not measured. Pass ``variants=`` to try others. Measurements:
``benchmarks/README.md``, "How fast the multipliers learn: a portfolio variant" and "The
multipliers' learning rate of a lone run".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

DEFAULT_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "kkt": [{}, {"lr_lambda": 1e-2}],
}

# Seconds one restart should get before a further restart pays more than a longer run: the
# issue's measurement on the demo victim (one kkt run plateaus after about 35-45 s on 2 cores).
SECONDS_PER_RESTART = 45.0
MAX_AUTO_RESTARTS = 64


def has_plan(method: str) -> bool:
    """Whether ``exhume attack`` runs a portfolio for ``method`` by default."""
    return method in DEFAULT_VARIANTS


def variants_for(method: str, fixed: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``method``'s default variants, less every parameter in ``fixed`` (the ones the caller set)."""
    fixed = set(fixed)
    return [{k: v for k, v in var.items() if k not in fixed} for var in DEFAULT_VARIANTS.get(method, [{}])]


def default_restarts(budget_seconds: float | None, workers: int) -> int:
    """How many restarts ``restarts="auto"`` runs: one wave per worker, more waves for longer budgets.

    Without a time budget (an iteration budget per restart), one restart per worker. With one, as
    many waves as fit ``SECONDS_PER_RESTART`` each (at least one), times the number of workers.
    """
    workers = max(1, int(workers))
    if budget_seconds is None:
        return min(workers, MAX_AUTO_RESTARTS)
    waves = max(1, math.floor(float(budget_seconds) / SECONDS_PER_RESTART))
    return max(1, min(workers * waves, MAX_AUTO_RESTARTS))
