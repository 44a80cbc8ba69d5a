"""Judging a reconstruction (docs/METHODS.md section 4).

:func:`evaluate_images` takes candidates, training images and (ideally) a pool of unseen images
from the same distribution, all in display space ``(n, C, H, W)`` in [0, 1], and returns an
:class:`EvalResult`: headline numbers in ``metrics`` (JSON-serialisable) and per-training-image
arrays in ``arrays``.

The headline figure is ``"memorised"``: the number of training images whose best reconstruction
has a strictly higher SSIM than the best image of the pool (chosen by the same rule). SSIM >= 0.4
alone is no proof of leakage: on MNIST a pool of unseen digits reaches it for nearly every
training digit, which ``"pool_ssim>=0.4"`` shows.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from ..errors import ConfigError, DataError
from .matching import MATCH_RULES, match_downsample, min_distances
from .matching import match as _match  # evaluate_images' parameter `match` shadows the name
from .ssim import as_images, window_description, window_for

__all__ = ["EvalResult", "evaluate_images"]

MEMORISED_DEFINITION = ("training images whose best reconstruction has strictly higher SSIM than "
                        "the best image of the pool of unseen images (same matching rule)")


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


@dataclass
class EvalResult:
    """Headline numbers (``metrics``, JSON-ready) and per-training-image arrays (``arrays``)."""

    metrics: dict
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def save(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Write ``metrics.json`` and ``arrays.npz`` into ``folder`` (created if needed)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        mpath, apath = folder / "metrics.json", folder / "arrays.npz"
        mpath.write_text(json.dumps(_jsonable(self.metrics), indent=2, allow_nan=False) + "\n")
        np.savez(apath, **{k: np.asarray(v) for k, v in self.arrays.items() if v is not None})
        return {"metrics": mpath, "arrays": apath}

    def summary(self) -> str:
        """A few lines for a terminal."""
        m = self.metrics
        lines = [f"{m['n_train']} training images, {m['n_candidates']} candidates, "
                 f"match rule {m['match_rule']}, SSIM {m['ssim_window']}"]
        thr = [k for k in m if k.startswith("ssim>=")]
        lines.append("nearest: " + ", ".join(f"{k}: {m[k]}" for k in thr)
                     + f", mean {m['ssim_mean']:.3f}")
        lines.append("one-to-one: " + ", ".join(f"{k}: {m['one_to_one_' + k]}" for k in thr))
        if m.get("memorised") is None:
            lines.append("memorised: not computed (no pool of unseen images)")
        else:
            lines.append(f"memorised: {m['memorised']} / {m['n_train']} "
                         f"(pool of {m['pool_size']} unseen images; pool alone reaches "
                         f"ssim>=0.4 for {m.get('pool_ssim>=0.4')})")
        return "\n".join(lines)


def _count(x: np.ndarray, t: float) -> int:
    return int(np.sum(np.nan_to_num(x, nan=-np.inf) >= t))


def _stats(x: np.ndarray) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    return (float(x.mean()), float(np.median(x))) if x.size else (float("nan"), float("nan"))


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
    rule = match
    train = as_images(train, "training images")
    candidates = as_images(candidates, "candidates")
    if train.shape[0] == 0:
        raise DataError("no training images to evaluate against")
    if candidates.shape[0] == 0:
        raise DataError("no candidates to evaluate")
    if candidates.shape[1:] != train.shape[1:]:
        raise DataError(f"candidates have shape (C, H, W) = {tuple(candidates.shape[1:])} but "
                        f"training images have {tuple(train.shape[1:])}")
    thresholds = tuple(float(t) for t in thresholds)
    n, m = train.shape[0], candidates.shape[0]
    win, sigma = window_for(train.shape)

    metrics: dict = {
        "n_train": n,
        "n_candidates": m,
        "pool_size": 0 if pool is None else None,
        "ssim_window": window_description(win, sigma),
        "match_rule": rule,
    }
    if rule != "ssim":
        metrics["match_downsample"] = match_downsample(train.shape, downsample)

    res = _match(train, candidates, rule, True, downsample)
    ssim, best = res["ssim"], res["best"]
    oto_ssim, oto = res["oto_ssim"], res["oto"]
    for t in thresholds:
        metrics[f"ssim>={t:g}"] = _count(ssim, t)
    metrics["ssim_mean"], metrics["ssim_median"] = _stats(ssim)
    for t in thresholds:
        metrics[f"one_to_one_ssim>={t:g}"] = _count(oto_ssim, t)
    metrics["one_to_one_ssim_mean"] = _stats(oto_ssim)[0]
    metrics["one_to_one_matched"] = int(np.sum(oto >= 0))
    metrics["distinct_candidates_matched"] = int(np.unique(best).size)

    arrays: dict[str, np.ndarray] = {
        "ssim": ssim, "best_candidate": best,
        "one_to_one_ssim": oto_ssim, "one_to_one_candidate": oto,
    }

    if pool is None:
        metrics["memorised"] = None
        metrics["memorised_note"] = ("not computed: no pool of unseen images was given, so SSIM "
                                     "alone cannot tell a training image from a plausible one")
    else:
        pool = as_images(pool, "pool")
        if pool.shape[0] == 0:
            raise DataError("the pool of unseen images is empty")
        if pool.shape[1:] != train.shape[1:]:
            raise DataError(f"pool images have shape (C, H, W) = {tuple(pool.shape[1:])} but "
                            f"training images have {tuple(train.shape[1:])}")
        metrics["pool_size"] = int(pool.shape[0])
        copies = int((min_distances(train, pool)[0] < 1e-4).sum())
        metrics["pool_exact_copies_of_train"] = copies
        if copies:
            warnings.warn(f"{copies} training image(s) have an exact copy in the pool; the pool "
                          f"should be disjoint from the training set", stacklevel=2)
        pres = _match(train, pool, rule, False, downsample)
        pool_ssim, best_pool = pres["ssim"], pres["best"]
        memorised = ssim > pool_ssim
        metrics["memorised"] = int(memorised.sum())
        metrics["memorised_note"] = MEMORISED_DEFINITION
        # If the candidates were m more *real* unseen images (exchangeable with the pool), each
        # training image's overall best would be a candidate with probability m / (m + pool).
        # Reconstructions are not exchangeable with real images (they are noisier), so this is
        # context, not the null; the evaluator's held-out control (run.evaluate) is the null.
        metrics["memorised_if_candidates_were_real_unseen_images"] = n * m / (m + int(pool.shape[0]))
        for t in thresholds:
            metrics[f"pool_ssim>={t:g}"] = _count(pool_ssim, t)
        metrics["pool_ssim_mean"], metrics["pool_ssim_median"] = _stats(pool_ssim)
        arrays.update(pool_ssim=pool_ssim, best_pool=best_pool, memorised=memorised)

    if margins is not None:
        margins = np.asarray(margins, dtype=np.float64).reshape(-1)
        if margins.shape[0] != n:
            raise DataError(f"got {margins.shape[0]} margins for {n} training images")
        arrays["margin"] = margins
        ok = np.isfinite(margins) & np.isfinite(ssim)
        metrics["margin_n"] = int(ok.sum())
        if ok.sum() >= 3 and np.ptp(margins[ok]) > 0 and np.ptp(ssim[ok]) > 0:
            r = spearmanr(margins[ok], ssim[ok])
            metrics["margin_spearman_rho"] = float(r.statistic)
            metrics["margin_spearman_p"] = float(r.pvalue)
        else:
            metrics["margin_spearman_rho"] = None
            metrics["margin_spearman_p"] = None
        sm = margins if support_margins is None else np.asarray(support_margins, dtype=np.float64).reshape(-1)
        if sm.shape[0] != n:
            raise DataError(f"got {sm.shape[0]} support margins for {n} training images")
        metrics["support_estimate"] = support_estimate(sm[np.isfinite(sm)])
        if "memorised" in arrays and arrays["memorised"].any():
            metrics["margin_median_memorised"] = float(np.median(margins[arrays["memorised"]]))
        if "memorised" in arrays and (~arrays["memorised"]).any():
            metrics["margin_median_not_memorised"] = float(
                np.median(margins[~arrays["memorised"]]))

    return EvalResult(metrics=_jsonable(metrics), arrays=arrays)

