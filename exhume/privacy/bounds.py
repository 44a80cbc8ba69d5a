"""The most any informed adversary reconstructs of a record from a model trained with DP-SGD (docs/METHODS.md §7).

:func:`rero_bound`: Hayes, Mahloujifar and Balle's (2023) ``B_κ`` for noise multiplier σ, Poisson rate q and T
steps, in closed form at q = 1 and from Google's ``dp_accounting`` privacy loss distribution below it (the value an
upper bound, ``low`` a lower estimate: the exact bound lies between); :func:`dp_bound`: from (ε, δ) alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from exhume.errors import ConfigError

#: the privacy loss grid of dp_accounting (its value_discretization_interval)
DISCRETISATION = 1e-4
#: at most this many grid points per step: a mechanism weaker than that is bounded by its explicit tests alone
MAX_POINTS = 4_000_000
INSTALL = 'pip install "exhume[dp]"'


@dataclass(frozen=True)
class Bound:
    """A reconstruction bound: ``value`` (≥ the exact B_κ, what to set beside a measurement), ``low`` (≤ it: the
    exact bound lies in ``[low, value]``), the baseline ``kappa`` and how it was computed."""

    value: float
    low: float
    kappa: float
    method: str

    @property
    def error(self) -> float:
        """The computation's error: the width of the interval the exact bound lies in."""
        return self.value - self.low

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error": self.error}


def _check(name: str, value: Any, low: float, high: float, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or value > high or (open_low and value == low):
        raise ConfigError(f"{name} must be a number in {'(' if open_low else '['}{low:g}, {high:g}], got {value!r}")
    return float(value)


def rero_bound(noise_multiplier: float, sample_rate: float, steps: int, kappa: float,
               discretisation: float = DISCRETISATION) -> Bound:
    """Hayes et al.'s B_κ for DP-SGD (σ, q, T) at baseline κ (the module docstring); 1 without noise."""
    sigma = _check("noise_multiplier", noise_multiplier, 0.0, math.inf)
    q = _check("sample_rate", sample_rate, 0.0, 1.0, open_low=True)
    kappa = _check("kappa", kappa, 0.0, 1.0)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ConfigError(f"steps must be a positive integer, got {steps!r}")
    if sigma == 0:
        return Bound(1.0, 1.0, kappa, "no noise: no guarantee")
    if kappa in (0.0, 1.0):
        return Bound(kappa, kappa, kappa, "a certain prior")
    if q == 1.0:
        value = float(stats.norm.cdf(stats.norm.ppf(kappa) + math.sqrt(steps) / sigma))
        return Bound(value, value, kappa, f"closed form: rate 1 is the Gaussian shift √T/σ = {math.sqrt(steps) / sigma:.4g}")
    low = tested(sigma, q, int(steps), kappa)
    if low >= 1.0 - 1e-12:
        return Bound(1.0, 1.0, kappa, "explicit test: a test of the noisy steps already succeeds with probability 1")
    if _points(sigma, q, discretisation) > MAX_POINTS:
        return Bound(1.0, low, kappa, f"too little noise for the loss distribution at grid {discretisation:g}: "
                                      "the explicit tests' success below, 1 above")
    high, buckets = (_from_pld(sigma, q, int(steps), kappa, discretisation, pessimistic) for pessimistic in (True, False))
    return Bound(high, min(high, max(low, buckets)), kappa, f"dp_accounting privacy loss distribution, grid {discretisation:g} "
                                                            "(connect-the-dots above, privacy buckets and explicit tests below)")


def _points(sigma: float, q: float, discretisation: float) -> float:
    """The grid points of one step's privacy loss: its range over the noise's ±10σ, over the grid."""
    top = math.log(q) + (1.0 + 20.0 * sigma) / (2.0 * sigma**2)
    return (max(top, 0.0) - math.log1p(-q)) / discretisation


def tested(sigma: float, q: float, steps: int, kappa: float) -> float:
    """A lower bound on B_κ: the better of two tests at level κ, each in closed form: "some step's noisy value
    is high" and "the steps' sum is high" (the optimal test at rate 1)."""
    p0 = -math.expm1(math.log1p(-kappa) / steps)  # each step's level, so that T steps together reach κ
    s = sigma * stats.norm.isf(p0)
    p1 = (1 - q) * p0 + q * stats.norm.sf((s - 1.0) / sigma)
    some = -math.expm1(steps * math.log1p(-min(p1, 1 - 1e-300)))
    t = sigma * math.sqrt(steps) * stats.norm.isf(kappa)
    k = np.arange(steps + 1)
    total = float(np.sum(stats.binom.pmf(k, steps, q) * stats.norm.sf((t - k) / (sigma * math.sqrt(steps)))))
    return float(min(1.0, max(some, total, kappa)))


def _from_pld(sigma: float, q: float, steps: int, kappa: float, discretisation: float, pessimistic: bool) -> float:
    """B_κ of the pair's privacy loss distribution composed ``steps`` times (``pessimistic``: connect-the-dots, an
    upper bound; else privacy buckets rounded down, a lower estimate)."""
    try:
        from dp_accounting.pld import privacy_loss_distribution as pld
    except ImportError:
        raise ConfigError(f"the reconstruction bound below sampling rate 1 needs Google's dp_accounting: {INSTALL}") from None
    one = pld.from_gaussian_mechanism(sigma, sampling_prob=q, pessimistic_estimate=pessimistic,
                                      value_discretization_interval=discretisation, use_connect_dots=pessimistic)
    return blow_up(one.self_compose(steps)._pmf_remove, kappa)


def blow_up(pmf, kappa: float) -> float:
    """sup{P(E) : Q(E) ≤ κ} of the pair (P, Q) whose privacy loss ``ln dP/dQ`` under P is ``pmf`` (dp_accounting's
    discretised distribution, with its mass at +∞): by Neyman–Pearson, E takes the largest losses first, and the
    loss where Q(E) reaches κ in part (a randomised test). Its private fields are read as ``riskcal`` reads them."""
    dense = pmf.to_dense_pmf()
    probs = np.clip(np.asarray(dense._probs, dtype=np.float64), 0.0, None)
    infinite = float(dense._infinity_mass)
    probs = probs * (1.0 - infinite) / probs.sum()
    losses = (dense._lower_loss + np.arange(len(probs))) * dense._discretization
    order = np.argsort(-losses, kind="stable")
    p, q_mass = probs[order], probs[order] * np.exp(-losses[order])
    q_cum, p_cum = np.cumsum(q_mass), infinite + np.cumsum(p)
    i = int(np.searchsorted(q_cum, kappa))
    if i >= len(q_cum):
        return 1.0
    before_q, before_p = (q_cum[i - 1], p_cum[i - 1]) if i else (0.0, infinite)
    share = (kappa - before_q) / q_mass[i] if q_mass[i] > 0 else 0.0
    return float(min(1.0, before_p + share * p[i]))


def dp_bound(epsilon: float, delta: float, kappa: float) -> float:
    """The bound from (ε, δ)-DP alone: ``1 − f(κ)``, f the (ε, δ) trade-off curve ``max(0, 1 − δ − e^ε·κ,
    e^{−ε}·(1 − δ − κ))``; for small κ Balle et al.'s ``e^ε·κ + δ``."""
    kappa = _check("kappa", kappa, 0.0, 1.0)
    delta = _check("delta", delta, 0.0, 1.0)
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0):
        raise ConfigError(f"epsilon must be a number ≥ 0, got {epsilon!r}")
    if not math.isfinite(epsilon) or epsilon > 700:
        return 1.0
    f = max(0.0, 1.0 - delta - math.exp(epsilon) * kappa, math.exp(-epsilon) * (1.0 - delta - kappa))
    return float(min(1.0, 1.0 - f))
