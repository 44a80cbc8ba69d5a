"""The privacy room: DP-SGD's reconstruction bound against values computed another way, and measured rates' intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _extras import need
from scipy import stats

from exhume.errors import ConfigError
from exhume.privacy import clopper_pearson, dp_bound, kappa_from_control, rero_bound

need("dp_accounting", "dp")


def _neyman_pearson(mu: np.ndarray, nu: np.ndarray, kappa: float) -> float:
    """sup ν(E) over μ(E) ≤ κ for densities on one grid (cells' masses), by sorting on the likelihood ratio."""
    order = np.argsort(-(nu / np.maximum(mu, 1e-300)))
    m, n = np.cumsum(mu[order]), np.cumsum(nu[order])
    i = int(np.searchsorted(m, kappa))
    return float(n[i - 1] + (kappa - m[i - 1]) / mu[order][i] * nu[order][i])


def test_one_step_below_rate_one_is_the_closed_form_of_a_mixture():
    """T = 1: the likelihood ratio grows with y, so E = {y > s}: ν(E) = (1 − q)·κ + q·P(N(1, σ²) > s)."""
    for sigma, q, kappa in ((1.0, 0.3, 0.1), (0.5, 0.05, 0.01), (2.0, 0.9, 0.5)):
        s = sigma * stats.norm.isf(kappa)
        exact = (1 - q) * kappa + q * stats.norm.sf((s - 1.0) / sigma)
        got = rero_bound(sigma, q, 1, kappa)
        assert got.low - 1e-9 <= exact <= got.value + 1e-9 and got.error < 2e-3, (sigma, q, got, exact)


def test_two_steps_below_rate_one_agree_with_a_direct_integration():
    """T = 2, q = 0.3: the Neyman–Pearson set of the 2-d mixture, integrated on a grid (no composition, no library)."""
    sigma, q, kappa = 1.0, 0.3, 0.05
    y = np.linspace(-8.0, 9.0, 1201)
    h = y[1] - y[0]
    a, b = stats.norm.pdf(y / sigma) / sigma * h, stats.norm.pdf((y - 1.0) / sigma) / sigma * h
    mu = np.outer(a, a).ravel()
    one = (1 - q) * a + q * b
    nu = np.outer(one, one).ravel()
    direct = _neyman_pearson(mu, nu, kappa)
    got = rero_bound(sigma, q, 2, kappa)
    assert got.low - 2e-3 <= direct <= got.value + 2e-3 and got.error < 5e-3, (got, direct)


def test_rate_one_is_the_composed_distribution_of_many_gaussian_steps():
    """At q = 1 the closed form (√T/σ) against dp_accounting's composition of T separate Gaussian steps."""
    from exhume.privacy.bounds import _from_pld

    for sigma, steps, kappa in ((8.0, 50, 0.01), (3.0, 10, 0.125)):
        closed = rero_bound(sigma, 1.0, steps, kappa)
        composed = _from_pld(sigma, 1.0, steps, kappa, 1e-4, pessimistic=True)
        assert closed.error == 0 and composed == pytest.approx(closed.value, abs=1e-3), (closed, composed)
        assert composed >= closed.value - 1e-7  # connect-the-dots never under the exact value (but for rounding)


def test_the_epsilon_delta_bound_holds_over_the_gaussian_curve_and_touches_it():
    """The Gaussian mechanism of shift μ = 1 is (ε, δ(ε))-DP (Balle and Wang 2018's exact δ): its (ε, δ) bound lies
    over its exact curve at every κ, with equality where the curve's slope is e^ε."""
    eps = 1.0
    delta = stats.norm.cdf(-eps + 0.5) - math.e * stats.norm.cdf(-eps - 0.5)
    kappas = np.linspace(0.001, 0.999, 400)
    gap = [dp_bound(eps, delta, k) - rero_bound(1.0, 1.0, 1, float(k)).value for k in kappas]
    assert min(gap) > -1e-9 and min(gap) < 1e-4
    assert dp_bound(3.0, 1e-5, 0.001) == pytest.approx(math.exp(3) * 0.001 + 1e-5)  # Balle et al.'s e^ε·κ + δ
    assert dp_bound(1.0, 0.0, 0.5) == pytest.approx(1 - 0.5 / math.e)  # where e^ε·κ + δ says 1


def test_too_little_noise_is_bounded_by_its_explicit_tests_and_no_noise_by_nothing():
    weak = rero_bound(0.01, 0.25, 400, 0.01)
    assert weak.value == 1.0 and weak.low > 0.999
    assert rero_bound(0.0, 0.5, 10, 0.01).value == 1.0
    strong = rero_bound(50.0, 0.25, 100, 0.1)
    assert 0.1 < strong.low <= strong.value < 0.11
    with pytest.raises(ConfigError, match="sample_rate must be a number in"):
        rero_bound(1.0, 0.0, 10, 0.1)
    with pytest.raises(ConfigError, match="steps must be a positive integer"):
        rero_bound(1.0, 0.5, 0, 0.1)


def test_clopper_pearson_is_scipys_exact_interval_and_kappa_its_one_sided_end():
    for k, n in ((0, 100), (1, 100), (37, 50), (8, 8)):
        want = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        assert clopper_pearson(k, n) == pytest.approx((want.low, want.high), abs=1e-12)
    assert clopper_pearson(0, 100)[1] == pytest.approx(1 - 0.025 ** (1 / 100))
    assert kappa_from_control(0, 200) == pytest.approx(1 - 0.05 ** (1 / 200))
    with pytest.raises(ConfigError, match="0 ≤ successes ≤ trials"):
        clopper_pearson(3, 2)
