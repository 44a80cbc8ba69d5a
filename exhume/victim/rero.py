"""Upper bounds on reconstruction success for a differentially private victim, to set beside a measurement.

Balle, Cherubin and Hayes (2022, "Reconstructing Training Data with Informed Adversaries") call a
training mechanism (η, γ)-ReRo (reconstruction robust) for a prior π over the target record when
no adversary, given the trained model *and every other training record*, reconstructs the target
within error η with probability above γ. The prior's baseline κ is the success without the model
(the best fixed guess's chance of being within η of a record drawn from π).

- :func:`hayes_bound`: Hayes, Mahloujifar and Balle (2023, "Bounding Training Data Reconstruction
  in DP-SGD"): DP-SGD with noise multiplier σ, Poisson rate q and T steps is (η, γ)-ReRo with γ the
  blow-up B_κ(μ, ν) = sup{ν(E) : μ(E) ≤ κ} of μ = N(0, σ²·I_T) and
  ν = Σ_w q^|w|·(1−q)^(T−|w|)·N(w, σ²·I_T), w ∈ {0, 1}^T (the target's clipped gradient, scaled to
  1, present at each step with probability q). By Neyman–Pearson E is where the likelihood ratio
  L = dν/dμ = Π_t (1 − q + q·exp((2y_t − 1)/(2σ²))) is largest. At q = 1 (full batch) this is
  exact: γ = Φ(Φ⁻¹(κ) + √T/σ); below 1 it is estimated by Monte Carlo (seeded): t the (1 − κ)-quantile
  of L over draws from μ, γ the share of draws from ν with L > t.
- :func:`rdp_bound`: Balle et al.'s bound from Rényi DP: γ = min_α (κ·e^{ε(α)})^{(α−1)/α}, ε(α)
  the RDP curve of the same (σ, q, T) from Opacus's RDP analysis (looser than Hayes et al.'s).
- :func:`dp_bound`: Balle et al.'s from (ε, δ)-DP alone: γ = e^ε·κ + δ (what the audit can compute
  from the ε and δ a user states).

These bound a *stronger* adversary than exhume's attacks: an informed one that knows every other
training record (and, for Hayes et al., could see every update). A measured memorised fraction is
one attack's success, a lower bound on the risk; the bound is the ceiling for any attack.
:func:`kappa_from_control` estimates κ from an evaluation's control: the chance that a record the
model never saw is "memorised" by the candidates (the upper end of its Clopper–Pearson interval).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: Monte Carlo draws of each distribution (and their seed) for Hayes et al.'s bound below sampling rate 1: the
#: estimate's standard error is about √(γ/SAMPLES), 0.0003 at γ = 0.01
SAMPLES, SEED = 100_000, 0


def _check_kappa(kappa: float) -> float:
    if not (isinstance(kappa, (int, float)) and 0.0 <= kappa <= 1.0):
        raise ValueError(f"kappa (the prior's baseline success) must be a probability in [0, 1], got {kappa!r}")
    return float(kappa)


def hayes_bound(noise_multiplier: float, sample_rate: float, steps: int, kappa: float, samples: int = SAMPLES,
                seed: int = SEED) -> float:
    """Hayes et al.'s (2023) ReRo bound γ for DP-SGD (σ, q, T) at baseline κ (see the module docstring); 1 without noise."""
    kappa = _check_kappa(kappa)
    if kappa in (0.0, 1.0) or noise_multiplier <= 0:
        return kappa if noise_multiplier > 0 else 1.0
    sigma, q, steps = float(noise_multiplier), float(sample_rate), int(steps)
    if q >= 1.0:
        return float(stats.norm.cdf(stats.norm.ppf(kappa) + math.sqrt(steps) / sigma))
    rng = np.random.default_rng(seed)
    under_mu = _draws(rng, samples, steps, sigma, q, with_target=False)
    under_nu = _draws(rng, samples, steps, sigma, q, with_target=True)
    threshold = np.quantile(under_mu, 1.0 - kappa)  # E = {L > t}: μ(E) = κ
    return float(min(1.0, max(kappa, float(np.mean(under_nu > threshold)))))  # ν(E), sampled from ν itself


def _draws(rng, samples: int, steps: int, sigma: float, q: float, with_target: bool) -> np.ndarray:
    """``log dν/dμ`` of ``samples`` draws of the T noisy steps from μ (noise alone) or ν (the target in each step w.p. q)."""
    out = []
    for i in range(0, samples, 2000):
        y = rng.normal(0.0, sigma, (min(2000, samples - i), steps))
        if with_target:
            y += rng.random(y.shape) < q
        out.append(_log_ratio(y, sigma, q))
    return np.concatenate(out)


def _log_ratio(y: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """``log dν/dμ`` of each row of ``y`` (one draw of the T noisy steps)."""
    per_step = np.logaddexp(math.log1p(-q), math.log(q) + (2.0 * y - 1.0) / (2.0 * sigma**2))
    return per_step.sum(axis=1)


def rdp_bound(noise_multiplier: float, sample_rate: float, steps: int, kappa: float) -> float:
    """Balle et al.'s (2022) ReRo bound from the RDP curve of DP-SGD (σ, q, T), Opacus's RDP analysis; 1 without noise."""
    from opacus.accountants.analysis.rdp import compute_rdp
    from opacus.accountants.rdp import RDPAccountant

    kappa = _check_kappa(kappa)
    if noise_multiplier <= 0:
        return 1.0
    if kappa == 0.0:
        return 0.0
    orders = np.array([a for a in RDPAccountant.DEFAULT_ALPHAS if a > 1] + [256.0, 512.0, 1024.0])
    eps = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=int(steps), orders=orders))
    exponent = (orders - 1.0) / orders * (math.log(kappa) + eps)
    return float(min(1.0, math.exp(min(0.0, float(np.min(exponent))))))


def dp_bound(epsilon: float, delta: float, kappa: float) -> float:
    """Balle et al.'s (2022) ReRo bound from (ε, δ)-DP alone: ``min(1, e^ε·κ + δ)``."""
    kappa = _check_kappa(kappa)
    if not math.isfinite(epsilon):
        return 1.0
    return float(min(1.0, math.exp(min(epsilon, 700.0)) * kappa + delta))


def kappa_from_control(matched: int, total: int, confidence: float = 0.95) -> float:
    """κ from a control: ``matched`` of ``total`` never-seen records counted memorised; the one-sided upper limit of
    the Clopper–Pearson interval at ``confidence`` (a bound's baseline is better too high than too low)."""
    if total <= 0 or not 0 <= matched <= total:
        raise ValueError(f"the control must count 0..{total} matched records of {total} > 0, got {matched}")
    if matched == total:
        return 1.0
    return float(stats.beta.ppf(confidence, matched + 1, total - matched))

