"""Does the attack's model of the victim hold? Evaluator-side checks for the verdict.

The checks of an attack's equation live with it (:mod:`exhume.attacks.equations`; named here too):
:func:`equation_of` gives the one the attack declares. For the stationarity attacks:

The KKT attack inverts ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``, which holds when (a) training ended
at (or near) a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` (or, without weight decay, near the
max-margin KKT point), (b) the network is what the attack differentiates: piecewise-linear
activations (ReLU, leaky ReLU) and no layer whose training-time behaviour differs from its
evaluation-time one (BatchNorm's batch statistics, dropout). When they fail, an attack that finds
nothing says little, so the verdict is *inconclusive* rather than *no evidence*.

**Relative stationarity residual** on the real training data (needs the training set, so only the
evaluator computes it):

- with weight decay ``w > 0``: ``‖∇_θ objective‖ / ‖w·θ‖`` (the number ``exhume train`` reports),
  which equals ``‖θ − Σ_i λ_i ∇_θ(−ℓ_i)‖ / ‖θ‖`` with the exact ``λ_i = 1/(n·w)``;
- without: ``min_{λ ≥ 0} ‖θ − Σ_i λ_i ∇_θ margin_i‖ / ‖θ‖`` (Haim et al.'s KKT condition, the
  best non-negative multipliers by NNLS).

0 is exact stationarity, 1 is no better than ``λ = 0``.

**Thresholds**: ``STATIONARITY_LIMIT = 0.5`` sits above every measured victim trained until its
loss plateaued, ``ATTACK_RESIDUAL_LIMIT = 0.5`` above every attack that converged. A residual below
the limit is necessary, not sufficient (a briefly trained victim without weight decay passes it;
the fit check catches it). Measured by ``benchmarks/audit_thresholds.py``: ``benchmarks/README.md``,
"Audit thresholds".
"""

from __future__ import annotations

# the checks of the stationarity equation live with it (exhume.attacks.equations); named here for the evaluator
from exhume.attacks.equations import (  # noqa: F401
    NO_DECAY_SCALE_RANGE,
    STATIONARITY_LIMIT,
    Equation,
    fit_failure,
    kkt_residual_nnls,
    relative_stationarity,
    scale_failure,
    stationarity_failure,
    unmodelled_layers,
)

#: attacks whose own final relative residual (exact ReLU derivative) stays above this did not find a KKT point
ATTACK_RESIDUAL_LIMIT = 0.5


def equation_of(method: str, view=None, attack_args: dict | None = None, recon=None) -> Equation:
    """The equation the attack ``method`` declares; for an attack not registered here, every check of
    the stationarity equation (a judgement never loosened by not knowing the attack).

    ``view`` (with ``attack_args``): the one a run of the attack with those settings inverts on that
    attacker's view (a known start changes it). ``recon``: the one a finished run recorded; a run
    on the known-start equation is checked by that equation, which needs the start (``view``)."""
    from exhume.attacks import ATTACKS, Attack
    from exhume.attacks.equations import KnownStart

    if method not in ATTACKS:
        return Attack.equation
    if view is not None:
        return ATTACKS[method].of_settings(attack_args).equation_on(view)
    kind = recon.record.equation.known_start_kind if recon is not None else None
    if kind is not None:
        return KnownStart(kind=kind)
    return ATTACKS[method].equation


def attack_failures(recon) -> list[str]:
    """The attack's own final residual, when it reports one, above ``ATTACK_RESIDUAL_LIMIT``.

    A pooled portfolio reports one residual per restart (``final_relative_stationarity_per_restart``):
    it fails when even its best restart stayed above the limit.
    """
    record = recon.record
    value = record.final_relative_stationarity
    what = "its final relative residual"
    if value is None:
        per = [float(v) for v in record.residuals_per_restart if v is not None]
        if per:
            value, what = min(per), f"the best final relative residual of its {len(per)} restarts"
    if value is None or value <= ATTACK_RESIDUAL_LIMIT:
        return []
    equation = "the stationarity equation" if record.equation.stationary else "the known-start equation"
    return [f"the attack did not find candidates that satisfy {equation} ({what} "
            f"{value:.3g} > {ATTACK_RESIDUAL_LIMIT:g}); a longer budget or other settings may"]
