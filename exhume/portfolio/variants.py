"""Which restarts a portfolio runs: the variant list per attack and the default number of restarts.

Restart ``k`` runs with seed ``seed + k`` and the overrides ``DEFAULT_VARIANTS[method][k % len]``
on top of the caller's keyword arguments, so restart 0 is always the caller's own settings.

Default variants apply only to what the caller left unset: a parameter the caller passed keeps the
caller's value on every restart (an explicit ``variants=`` list overrides as given).

kkt's restarts alternate the learning rate of the multipliers, ``lr_lambda`` 1e-4 (kkt's default
for classifiers) and 1e-2, each with kkt's other defaults (constant learning rates and the averaged iterate,
:mod:`exhume.attacks.kkt`). Why: the equation of a homogeneous network does not fix the
multipliers' scale; learned fast, it drifts on some victims (mnist-256-haim: 14 memorised with
every restart at 1e-2, 19 at 1e-4) and must move on others (digits-multiclass-haim: 9 against 4).
Measured on the zoo (``benchmarks/zoo``, 90 s per portfolio, 2 cores, under the cosine schedule
that was kkt's default then): over ten victims with seed 0 and six of them with seed 1, the
alternation memorised 199 training images (control 9) against 185 (control 8) for restarts that
differ by seed only; it trails on the 10-class digits victim without weight decay with both seeds
(8 and 6 against 9 and 9). Tables in
``benchmarks/README.md``. Restart 0 (and a portfolio of one) takes kkt's ``lr_lambda="auto"``, 1e-4 for
classifiers, since 2026-11-26 (for regression 1e-2, so both restarts learn at 1e-2 there): one run of
2,000 iterations at 1e-4 memorised more than one at 1e-2 on twelve of fifteen zoo victims (273 against
219; behind on 10-class digits without weight decay, 6 against 17, and the CNN, 0 against 1), and two
restarts at 1e-4 more than the alternation on nine of fifteen (314 against 297) but 13 against 17 on
10-class digits without weight decay, where 1e-2 gave 24; the alternation stays for its hedge.
The first measurement behind the portfolio: on the demo victim, 4 restarts of 45 s with different
seeds, pooled, gave 23 memorised against 13 for one 180-s run (issue 10); the single runs found
different digits. The λ scale as a variant was measured and did not pay (``lambda_scale_factor``
0.5 and 2 on two of four restarts, four zoo victims, two seeds: 121 memorised against 122 for
seeds alone). Nor did α (the surrogate's sharpness) 45 on half of the restarts: +5 memorised over ten
victims at 4 restarts of 2,500 iterations (136 against 131), control +3, behind on two digits victims
(``benchmarks/variant_screen.py``). The optimiser was not measured. Pass ``variants=`` to try others.
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
