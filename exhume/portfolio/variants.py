"""Which restarts a portfolio runs: the variant list per attack and the default number of restarts.

Restart ``k`` runs with seed ``seed + k`` and the overrides ``DEFAULT_VARIANTS[method][k % len]``
on top of the caller's keyword arguments, so restart 0 is always the caller's own settings.

kkt's restarts differ by their seed only, each with kkt's defaults (a cosine learning-rate decay
over the restart's own budget and the averaged iterate, :mod:`exhume.attacks.kkt`). What was
measured: on the demo victim, 4 restarts of 45 s with different seeds, pooled, gave 23 memorised
against 13 for one 180-s run (issue 10); the single runs found different digits. Variants of the
surrogate slope α or the optimiser were not measured on the zoo (``benchmarks/zoo``). The λ scale
was (``lambda_scale_factor`` 0.5 and 2 on two of four restarts, four zoo victims, two seeds: 121
memorised against 122 for seeds alone, ``benchmarks/README.md``), so none is in the default set;
pass ``variants=`` to try them.
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "kkt": [{}],
}

# Seconds one restart should get before a further restart pays more than a longer run: the
# issue's measurement on the demo victim (one kkt run plateaus after about 35-45 s on 2 cores).
SECONDS_PER_RESTART = 45.0
MAX_AUTO_RESTARTS = 64


def has_plan(method: str) -> bool:
    """Whether ``exhume attack`` runs a portfolio for ``method`` by default."""
    return method in DEFAULT_VARIANTS


def variants_for(method: str) -> list[dict[str, Any]]:
    return [dict(v) for v in DEFAULT_VARIANTS.get(method, [{}])]


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
