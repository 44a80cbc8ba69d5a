"""Which restarts a portfolio runs: the variant list per attack and the default number of restarts.

PROVISIONAL. This file is the one place that says which settings the restarts of a portfolio try;
the research on which variants pay (issue 10, "robust defaults, chosen on a victim zoo") edits it.
Restart ``k`` runs with seed ``seed + k`` and the overrides ``DEFAULT_VARIANTS[method][k % len]``
on top of the caller's keyword arguments, so restart 0 is always the caller's own settings.

The provisional kkt set: half the restarts keep the defaults (the issue measured 4 default
restarts with different seeds, pooled, at 23 memorised against 13 for one run of the same total
budget on the demo victim); the others try a softer and a sharper ReLU surrogate derivative
(α = 10 and 40 around the default 19), the setting that decides how the non-smooth stationarity
equation is approximated. These values are choices, not measurements.
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "kkt": [
        {},
        {"alpha": 10.0},
        {},
        {"alpha": 40.0},
    ],
}

# Seconds one restart should get before a further restart pays more than a longer run: the
# issue's measurement on the demo victim (one kkt run plateaus after about 35-45 s on 2 cores).
SECONDS_PER_RESTART = 45.0
MAX_AUTO_RESTARTS = 32


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
