"""Judging a reconstruction (docs/METHODS.md section 4).

:func:`evaluate_images` takes candidates, training images and (ideally) a pool of unseen images
from the same distribution, all in display space ``(n, C, H, W)`` in [0, 1], and returns an
:class:`EvalResult`: headline numbers in ``metrics`` (a typed :class:`Metrics`, written as
``metrics.json``) and per-training-image arrays in ``arrays``.

The headline figure is ``"memorised"``: the number of training images whose best reconstruction
has a strictly higher SSIM than the best image of the pool (chosen by the same rule). SSIM >= 0.4
alone is no proof of leakage: on MNIST a pool of unseen digits reaches it for nearly every
training digit, which ``"pool_ssim>=0.4"`` shows.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from ..errors import ConfigError, DataError
from ..files.jsonio import atomic_write
from ..files.records import Record, count, entry
from .matching import MATCH_RULES, match_downsample, min_distances
from .matching import match as _match  # evaluate_images' parameter `match` shadows the name
from .ssim import as_images, window_description, window_for
from .verdict import VERDICTS

__all__ = ["EvalResult", "Metrics", "evaluate_images"]

MEMORISED_DEFINITION = ("training images whose best reconstruction has strictly higher SSIM than "
                        "the best image of the pool of unseen images (same matching rule)")
NO_POOL_NOTE = ("not computed: no pool of unseen images was given, so SSIM alone cannot tell a training image "
                "from a plausible one")


@dataclass(eq=False)
class Metrics(Record):
    """The headline numbers of an evaluation: ``metrics.json``, one typed field per key.

    Each field's annotation is its type and :func:`~exhume.files.records.entry` its JSON key,
    range and when it is written: fields of a ``group`` appear together (the pool's, the margins',
    the restarts', the control's, the run's, the verdict's), ``omit_none`` ones only once set.
    Reading checks a file against these types (:meth:`read`); older files, without the fields
    added since, load with them None. To add a field, add one line here (``omit_none=True`` keeps
    older runs' files unchanged). It is also the mapping ``metrics.json`` holds:
    ``metrics["memorised"]``, ``metrics["ssim>=0.4"]``.
    """

    WHAT = "the metrics.json written by 'exhume evaluate'"

    # the candidates against the training images (evaluate_images)
    n_train: int | None = count(required=True)
    n_candidates: int | None = count()
    pool_size: int | None = count()
    ssim_window: str | None = entry()
    match_rule: str | None = entry(choices=MATCH_RULES)
    match_downsample: int | None = count(omit_none=True)
    ssim_at: dict[float, int] | None = count(pattern="ssim>={}", at_most="n_train")  # nearest candidate, by threshold
    ssim_mean: float | None = entry()
    ssim_median: float | None = entry()
    one_to_one_at: dict[float, int] | None = count(pattern="one_to_one_ssim>={}", at_most="n_train")
    one_to_one_ssim_mean: float | None = entry()
    one_to_one_matched: int | None = count(at_most="n_train")
    distinct_candidates_matched: int | None = count(at_most="n_candidates")
    pool_exact_copies_of_train: int | None = count(group="pool", at_most="n_train")
    memorised: int | None = count(at_most="n_train")  # None: no pool of unseen images
    memorised_note: str | None = entry()
    # the pool of unseen images
    memorised_if_candidates_were_real_unseen_images: float | None = entry(group="pool")
    pool_ssim_at: dict[float, int] | None = count(pattern="pool_ssim>={}", group="pool", at_most="n_train")
    pool_ssim_mean: float | None = entry(group="pool")
    pool_ssim_median: float | None = entry(group="pool")
    # the training margins
    margin_n: int | None = count(group="margins", at_most="n_train")
    margin_spearman_rho: float | None = entry(group="margins")
    margin_spearman_p: float | None = entry(group="margins")
    support_estimate: float | None = entry(group="margins")
    margin_median_memorised: float | None = entry(group="margins", omit_none=True)
    margin_median_not_memorised: float | None = entry(group="margins", omit_none=True)
    # the restarts of a pooled portfolio (exhume.evaluation.restarts)
    memorised_per_restart: list[int] | None = count(group="restarts")
    memorised_found_by: dict[str, int] | None = count(group="restarts")
    memorised_found_by_note: str | None = entry(group="restarts")
    # the held-out control (exhume.evaluation.run.evaluate)
    memorised_control: int | None = count(group="control", at_most="control_size")
    control_size: int | None = count(group="control")
    one_to_one_control: int | None = count("one_to_one_ssim>=0.4_control", group="control", at_most="control_size")
    memorised_control_note: str | None = entry(group="control")
    control_exact_copies_of_train: int | None = count(group="control", omit_none=True, at_most="control_size")
    memorised_control_oracle: int | None = count(group="control", omit_none=True, at_most="control_size")
    memorised_control_oracle_note: str | None = entry(group="control", omit_none=True)
    # the run
    pool_description: str | None = entry(group="run")
    membership_auc: float | None = entry(group="run", omit_none=True)
    membership: dict[str, Any] | None = entry(group="run", omit_none=True)
    attack: dict[str, Any] | None = entry(group="run")
    victim: dict[str, Any] | None = entry(group="run")
    # the verdict (exhume.evaluation.verdict)
    verdict: str | None = entry(group="verdict", choices=VERDICTS)
    verdict_reason: str | None = entry(group="verdict")
    p_value: float | None = entry(group="verdict")
    alpha: float | None = entry(group="verdict", low=0.0, high=1.0)
    verdict_test: str | None = entry(group="verdict")
    assumption_failures: list[str] | None = entry(group="verdict")
    # what the attacker knew: "weights only", or the start (and, where the attack left the start out, why)
    threat_model: str | None = entry(group="verdict", omit_none=True)
    # what only the owner's audit measures (exhume.evaluation.identifiability, exhume.evaluation.weights_membership)
    identifiability: dict[str, Any] | None = entry(group="verdict", omit_none=True)
    membership_exposure: dict[str, Any] | None = entry(group="verdict", omit_none=True)
    layers: dict[str, Any] | None = entry(group="verdict", omit_none=True)  # where the span shows (exhume.evaluation.layers)
    evaluation_seconds: float | None = entry(omit_none=True, low=0.0)
    audit: dict[str, Any] | None = entry(omit_none=True)  # the audit's settings (exhume.audit)
    law: dict[str, Any] | None = entry(omit_none=True)  # p, d, n and p/(d·n) (exhume.audit.law)
    demo_wall_seconds: float | None = entry(omit_none=True, low=0.0)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def thresholds(self) -> list[float]:
        """The SSIM thresholds counted (``ssim>=t``), ascending."""
        return sorted(self.ssim_at or {})

    def set_verdict(self, verdict) -> None:
        """Record a :class:`~exhume.evaluation.verdict.Verdict`."""
        self.verdict, self.verdict_reason, self.p_value = verdict.verdict, verdict.reason, verdict.p_value
        self.alpha, self.verdict_test, self.assumption_failures = verdict.alpha, verdict.test, list(verdict.assumption_failures)


@dataclass
class EvalResult:
    """Headline numbers (``metrics``, a :class:`Metrics`) and per-training-image arrays (``arrays``)."""

    metrics: Metrics
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Metrics):  # a plain dict, as earlier versions took
            self.metrics = Metrics.from_mapping(self.metrics)

    def save(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Write ``metrics.json`` and ``arrays.npz`` into ``folder`` (created if needed), each atomically."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        mpath, apath = folder / "metrics.json", folder / "arrays.npz"
        self.metrics.write(mpath)
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.asarray(v) for k, v in self.arrays.items() if v is not None})
        atomic_write(apath, buffer.getvalue())
        return {"metrics": mpath, "arrays": apath}

    def summary(self) -> str:
        """A few lines for a terminal."""
        m = self.metrics
        nearest, oto = m.ssim_at or {}, m.one_to_one_at or {}
        lines = [f"{m.n_train} training images, {m.n_candidates} candidates, match rule {m.match_rule}, SSIM {m.ssim_window}",
                 "nearest: " + ", ".join(f"ssim>={t:g}: {c}" for t, c in nearest.items()) + f", mean {m.ssim_mean:.3f}",
                 "one-to-one: " + ", ".join(f"ssim>={t:g}: {oto.get(t)}" for t in nearest)]
        if m.memorised is None:
            lines.append("memorised: not computed (no pool of unseen images)")
        else:
            lines.append(f"memorised: {m.memorised} / {m.n_train} (pool of {m.pool_size} unseen images; pool alone reaches "
                         f"ssim>=0.4 for {(m.pool_ssim_at or {}).get(0.4)})")
        return "\n".join(lines)


def _count(x: np.ndarray, t: float) -> int:
    return int(np.sum(np.nan_to_num(x, nan=-np.inf) >= t))


def _finite(v) -> float | None:
    """``v`` as a float, None when it is NaN or infinite (JSON has no such numbers)."""
    v = float(v)
    return v if math.isfinite(v) else None


def _stats(x: np.ndarray) -> tuple[float | None, float | None]:
    x = x[np.isfinite(x)]
    return (_finite(x.mean()), _finite(np.median(x))) if x.size else (None, None)


def support_estimate(margins: np.ndarray) -> float | None:
    """How many training points carry the stationarity equation: ``(Σw)²/Σw²`` with ``w_i = σ(−margin_i)``.

    For a binary model trained with the logistic loss and weight decay, ``w_i`` is proportional to
    training point ``i``'s multiplier ``λ_i = σ(−margin_i)/(n·w)`` (docs/METHODS.md §1), so this is
    the participation ratio of the true multipliers: ``n`` when all margins are equal, near 1 when
    one point's margin is far below the others'. A point whose multiplier is negligible barely
    enters ``θ = Σ λ_i ∇_θ margin_i`` and cannot be read back from it, so this estimates how many
    training images a stationarity attack can recover. A multiclass model trained with
    cross-entropy weighs point ``i`` by ``1 − p_y = σ(−soft margin)``, so the evaluator passes the
    soft margins (:func:`exhume.losses.soft_margin`) for it, and the same holds. For a model
    trained without weight decay, and for other losses, it is a proxy.
    Evaluator-side: it needs the training set. ``None`` without margins.
    """
    q = np.asarray(margins, dtype=np.float64).reshape(-1)
    if q.size == 0:
        return None
    # σ(−q) relative to the largest weight, in log space so that margins of 1000 do not underflow to 0/0
    log_w = -np.logaddexp(0.0, q)
    w = np.exp(log_w - log_w.max())
    return float(w.sum() ** 2 / (w**2).sum())


def evaluate_images(candidates, train, pool=None, margins: np.ndarray | None = None,
                    match: str = "ssim", thresholds: Sequence[float] = (0.4, 0.5),
                    downsample: int | str | None = "auto", support_margins: np.ndarray | None = None) -> EvalResult:
    """Judge ``candidates`` against ``train`` (and ``pool``), all ``(n, C, H, W)`` in [0, 1].

    ``pool``: unseen images from the training distribution, disjoint from ``train`` (METHODS
    suggests 1000); without it the memorisation count is not computed. ``margins``: each training
    image's margin ``y_i Phi(x_i)``, for the SSIM-vs-margin correlation and :func:`support_estimate`;
    ``support_margins``: the margins for :func:`support_estimate` instead (for a cross-entropy
    multiclass model, the soft margins, see :func:`exhume.evaluation.run.margins_of`).
    ``match``: ``"ssim"``, ``"l2"`` or ``"ncc"`` (applied alike to candidates and pool;
    ``downsample`` is for the distance rules, see :mod:`exhume.evaluation.matching`).
    """
    if match not in MATCH_RULES:
        raise ConfigError(f"unknown match rule {match!r}; expected one of {', '.join(MATCH_RULES)}")
    train, candidates = _inputs(train, candidates)
    thresholds = tuple(float(t) for t in thresholds)
    win, sigma = window_for(train.shape)
    metrics = Metrics(n_train=train.shape[0], n_candidates=candidates.shape[0], pool_size=0 if pool is None else None,
                      ssim_window=window_description(win, sigma), match_rule=match,
                      match_downsample=None if match == "ssim" else match_downsample(train.shape, downsample))
    arrays = _against_training(metrics, _match(train, candidates, match, True, downsample), thresholds)
    if pool is None:
        metrics.memorised_note = NO_POOL_NOTE
    else:
        _against_pool(metrics, arrays, train, pool, match, thresholds, downsample)
    if margins is not None:
        _margin_stats(metrics, arrays, margins, support_margins)
    return EvalResult(metrics=metrics, arrays=arrays)


def _inputs(train, candidates):
    """The training images and the candidates as images of one shape, refused in one line otherwise."""
    train = as_images(train, "training images")
    candidates = as_images(candidates, "candidates")
    if train.shape[0] == 0:
        raise DataError("no training images to evaluate against")
    if candidates.shape[0] == 0:
        raise DataError("no candidates to evaluate")
    if candidates.shape[1:] != train.shape[1:]:
        raise DataError(f"candidates have shape (C, H, W) = {tuple(candidates.shape[1:])} but "
                        f"training images have {tuple(train.shape[1:])}")
    return train, candidates


def _against_training(metrics: Metrics, res: dict, thresholds: tuple[float, ...]) -> dict[str, np.ndarray]:
    """The counts of the nearest and of the one-to-one matches; the per-training-image arrays."""
    ssim, best, oto_ssim, oto = res["ssim"], res["best"], res["oto_ssim"], res["oto"]
    metrics.ssim_at = {t: _count(ssim, t) for t in thresholds}
    metrics.ssim_mean, metrics.ssim_median = _stats(ssim)
    metrics.one_to_one_at = {t: _count(oto_ssim, t) for t in thresholds}
    metrics.one_to_one_ssim_mean = _stats(oto_ssim)[0]
    metrics.one_to_one_matched = int(np.sum(oto >= 0))
    metrics.distinct_candidates_matched = int(np.unique(best).size)
    return {"ssim": ssim, "best_candidate": best, "one_to_one_ssim": oto_ssim, "one_to_one_candidate": oto}


def _against_pool(metrics: Metrics, arrays: dict, train, pool, rule: str, thresholds: tuple[float, ...], downsample) -> None:
    """The memorisation count: training images whose best candidate beats the best pool image."""
    pool = as_images(pool, "pool")
    if pool.shape[0] == 0:
        raise DataError("the pool of unseen images is empty")
    if pool.shape[1:] != train.shape[1:]:
        raise DataError(f"pool images have shape (C, H, W) = {tuple(pool.shape[1:])} but "
                        f"training images have {tuple(train.shape[1:])}")
    n, m = metrics.n_train, metrics.n_candidates
    metrics.pool_size = int(pool.shape[0])
    copies = int((min_distances(train, pool)[0] < 1e-4).sum())
    metrics.pool_exact_copies_of_train = copies
    if copies:
        warnings.warn(f"{copies} training image(s) have an exact copy in the pool; the pool "
                      f"should be disjoint from the training set", stacklevel=3)
    pres = _match(train, pool, rule, False, downsample)
    pool_ssim, best_pool = pres["ssim"], pres["best"]
    memorised = arrays["ssim"] > pool_ssim
    metrics.memorised = int(memorised.sum())
    metrics.memorised_note = MEMORISED_DEFINITION
    # If the candidates were m more *real* unseen images (exchangeable with the pool), each
    # training image's overall best would be a candidate with probability m / (m + pool).
    # Reconstructions are not exchangeable with real images (they are noisier), so this is
    # context, not the null; the evaluator's held-out control (run.evaluate) is the null.
    metrics.memorised_if_candidates_were_real_unseen_images = n * m / (m + int(pool.shape[0]))
    metrics.pool_ssim_at = {t: _count(pool_ssim, t) for t in thresholds}
    metrics.pool_ssim_mean, metrics.pool_ssim_median = _stats(pool_ssim)
    arrays.update(pool_ssim=pool_ssim, best_pool=best_pool, memorised=memorised)


def _margin_stats(metrics: Metrics, arrays: dict, margins, support_margins) -> None:
    """SSIM against the training margins (Spearman), the support estimate, the margins of the memorised."""
    n, ssim = metrics.n_train, arrays["ssim"]
    margins = np.asarray(margins, dtype=np.float64).reshape(-1)
    if margins.shape[0] != n:
        raise DataError(f"got {margins.shape[0]} margins for {n} training images")
    arrays["margin"] = margins
    ok = np.isfinite(margins) & np.isfinite(ssim)
    metrics.margin_n = int(ok.sum())
    if ok.sum() >= 3 and np.ptp(margins[ok]) > 0 and np.ptp(ssim[ok]) > 0:
        r = spearmanr(margins[ok], ssim[ok])
        metrics.margin_spearman_rho, metrics.margin_spearman_p = _finite(r.statistic), _finite(r.pvalue)
    sm = margins if support_margins is None else np.asarray(support_margins, dtype=np.float64).reshape(-1)
    if sm.shape[0] != n:
        raise DataError(f"got {sm.shape[0]} support margins for {n} training images")
    estimate = support_estimate(sm[np.isfinite(sm)])
    metrics.support_estimate = None if estimate is None else _finite(estimate)
    memorised = arrays.get("memorised")
    if memorised is not None and memorised.any():
        metrics.margin_median_memorised = _finite(np.median(margins[memorised]))
    if memorised is not None and (~memorised).any():
        metrics.margin_median_not_memorised = _finite(np.median(margins[~memorised]))
