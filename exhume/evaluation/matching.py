"""Pairing training images with candidates (or pool images).

Rows are training images, columns are candidates. Three rules pick a row's partner:

* ``"ssim"``: the column with the highest SSIM;
* ``"l2"``: the nearest column in Euclidean distance, then its SSIM is reported;
* ``"ncc"``: the column with the highest normalised cross-correlation (Pearson correlation of
  the flattened images), i.e. the smallest ``1 - NCC``, then its SSIM is reported.

For the distance rules, 32x32 (or larger) colour images are downsampled 2x (2x2 average) before
the distance is taken, as the reference implementation does (``downsample="auto"``).
The same rule must be applied to the candidates and to the pool of unseen images.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from ..errors import ConfigError, DataError
from ..files.limits import LIMITS
from .ssim import as_images, ssim_matrix, ssim_pairs

MATCH_RULES = ("ssim", "l2", "ncc")

__all__ = [
    "MATCH_RULES",
    "best_match",
    "one_to_one",
    "l2_matrix",
    "ncc_matrix",
    "match_downsample",
    "rule_similarity",
    "match",
]


def _np(sim) -> np.ndarray:
    if isinstance(sim, Tensor):
        sim = sim.detach().cpu().numpy()
    sim = np.asarray(sim, dtype=np.float64)
    if sim.ndim != 2:
        raise DataError(f"a similarity matrix must be 2-D (n, m), got shape {sim.shape}")
    return sim


def best_match(sim) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``sim`` ``(n, m)`` (higher = more similar): ``(argmax index, max value)``."""
    sim = _np(sim)
    if sim.shape[1] == 0:
        raise DataError("cannot match against an empty set of candidates (m = 0)")
    idx = sim.argmax(axis=1)
    return idx, sim[np.arange(sim.shape[0]), idx]


def one_to_one(sim) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-to-one matching maximising the total similarity (Hungarian algorithm).

    Returns ``(row_ind, col_ind, values)`` as :func:`scipy.optimize.linear_sum_assignment` does:
    ``min(n, m)`` pairs, rows sorted. When there are fewer candidates than rows (``m < n``), the
    rows left out have no partner.
    """
    sim = _np(sim)
    if not np.isfinite(sim).all():
        raise DataError("similarity matrix contains NaN or infinite values")
    rows, cols = linear_sum_assignment(sim, maximize=True)
    return rows, cols, sim[rows, cols]


def _flat(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).to(torch.float64)


def l2_matrix(a, b) -> Tensor:
    """Euclidean distances ``(n, m)`` between the flattened images of ``a`` and ``b``."""
    a, b = as_images(a, "a", check_range=False), as_images(b, "b", check_range=False)
    return torch.cdist(_flat(a), _flat(b))


def ncc_matrix(a, b) -> Tensor:
    """Normalised cross-correlation ``(n, m)`` in [-1, 1] (higher = more similar).

    Pearson correlation of the flattened images; a constant image correlates 0 with anything.
    """
    a, b = as_images(a, "a", check_range=False), as_images(b, "b", check_range=False)
    return (unit_rows(_flat(a)) @ unit_rows(_flat(b)).T).clamp_(-1.0, 1.0)


def unit_rows(flat: Tensor) -> Tensor:
    """Rows ``(n, d)`` centred and scaled to unit norm (a constant row becomes 0), in float64: the
    dot product of two such rows is their Pearson correlation, the rule of :func:`ncc_matrix`."""
    f = flat.to(torch.float64)
    f = f - f.mean(1, keepdim=True)
    norm = f.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, f / norm.clamp_min(1e-300), torch.zeros_like(f))


def match_downsample(shape, downsample: int | str | None = "auto") -> int:
    """The factor the distance rules downsample by: ``"auto"`` = 2 for colour >= 32x32, else 1."""
    if downsample == "auto":
        c, h, w = int(shape[-3]), int(shape[-2]), int(shape[-1])
        return 2 if (c == 3 and min(h, w) >= 32) else 1
    if downsample is None:
        return 1
    if int(downsample) < 1:
        raise ConfigError(f"downsample must be a positive integer or 'auto', got {downsample!r}")
    return int(downsample)


def rule_similarity(a, b, rule: str = "ssim", downsample: int | str | None = "auto") -> Tensor:
    """The matrix ``(n, m)`` a rule maximises: SSIM, ``-L2`` distance, or NCC."""
    if rule not in MATCH_RULES:
        raise ConfigError(f"unknown match rule {rule!r}; expected one of {', '.join(MATCH_RULES)}")
    a, b = as_images(a, "a"), as_images(b, "b")
    if rule == "ssim":
        return ssim_matrix(a, b)
    f = match_downsample(a.shape, downsample)
    if f > 1:
        a, b = F.avg_pool2d(a, f), F.avg_pool2d(b, f)
    return -l2_matrix(a, b) if rule == "l2" else ncc_matrix(a, b)


def _block(rows: int) -> int:
    """Columns per block: at most ``LIMITS.candidates_x_pool_block`` similarities and 2048 images."""
    return max(1, min(2048, LIMITS.candidates_x_pool_block // max(rows, 1)))


def best_match_blocked(a, b, rule: str = "ssim", downsample: int | str | None = "auto") -> tuple[np.ndarray, np.ndarray]:
    """:func:`best_match` of ``rule_similarity(a, b)`` computed over blocks of ``b`` (at most
    ``LIMITS.candidates_x_pool_block`` similarities held at once); ties keep the first column."""
    n, m = a.shape[0], b.shape[0]
    step = _block(n)
    best, value = np.zeros(n, dtype=np.int64), np.full(n, -np.inf)
    for j0 in range(0, m, step):
        idx, val = best_match(rule_similarity(a, b[j0:j0 + step], rule, downsample))
        better = (val > value) | (j0 == 0)
        best[better], value[better] = idx[better] + j0, val[better]
    return best, value


def min_distances(a, b) -> tuple[Tensor, Tensor]:
    """Euclidean ``(min over b for each a, min over a for each b)`` of flattened images, in blocks of ``b``.

    Each block ranks pairs by ``|a|² + |b|² − 2 a·b`` (no whole matrix, no copy of ``a`` per block)
    and measures the nearest pairs exactly (an exact copy is at distance 0.0).
    """
    fa = _flat(torch.as_tensor(a))
    fb = _flat(torch.as_tensor(b))
    na = torch.linalg.vector_norm(fa, dim=1).square_()
    step = _block(fa.shape[0])
    row = torch.full((fa.shape[0],), float("inf"), dtype=torch.float64)
    cols = []
    for j0 in range(0, fb.shape[0], step):
        bj = fb[j0:j0 + step]
        d2 = torch.addmm(na[:, None] + (bj * bj).sum(1)[None, :], fa, bj.T, alpha=-2.0)
        near_b, near_a = d2.argmin(1), d2.argmin(0)
        row = torch.minimum(row, torch.linalg.vector_norm(fa - bj[near_b], dim=1))
        cols.append(torch.linalg.vector_norm(fa[near_a] - bj, dim=1))
    return row, torch.cat(cols)


def match(train, cands, rule: str = "ssim", one_to_one_too: bool = True,
          downsample: int | str | None = "auto") -> dict[str, np.ndarray]:
    """Pair every training image with a candidate by ``rule`` and report the pairs' SSIM.

    Returns a dict of per-training-image arrays: ``"best"`` (index), ``"ssim"`` (SSIM of that
    pair) and, with ``one_to_one_too``, ``"oto"`` (index, -1 where unmatched) and ``"oto_ssim"``
    (NaN where unmatched), from a Hungarian matching that maximises the rule's total similarity.
    """
    train, cands = as_images(train, "train"), as_images(cands, "candidates")
    if cands.shape[0] == 0:
        raise DataError("cannot match against an empty set of candidates")
    n = train.shape[0]
    if not one_to_one_too:  # nearest only: column blocks, a bounded footprint whatever the pool size
        best, value = best_match_blocked(train, cands, rule, downsample)
        if rule == "ssim":
            return {"best": best, "ssim": value}
        return {"best": best, "ssim": ssim_pairs(train, cands[torch.as_tensor(best)]).numpy()}
    if n * cands.shape[0] > LIMITS.one_to_one_entries:
        raise DataError(f"{n} training images x {cands.shape[0]} candidates exceed the one-to-one matching's limit of "
                        f"{LIMITS.one_to_one_entries} pairs; evaluate fewer candidates")
    step = _block(n)  # per-image statistics of at most one block of candidates at a time
    sim = torch.cat([rule_similarity(train, cands[j0:j0 + step], rule, downsample)
                     for j0 in range(0, cands.shape[0], step)], dim=1)
    best, _ = best_match(sim)
    out: dict[str, np.ndarray] = {"best": best}
    ssim_full = sim.numpy() if rule == "ssim" else None

    def pair_ssim(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        if ssim_full is not None:
            return ssim_full[rows, cols]
        if len(rows) == 0:
            return np.zeros(0)
        return ssim_pairs(train[torch.as_tensor(rows)], cands[torch.as_tensor(cols)]).numpy()

    out["ssim"] = pair_ssim(np.arange(n), best)
    if one_to_one_too:
        rows, cols, _ = one_to_one(sim)
        oto = np.full(n, -1, dtype=np.int64)
        oto_ssim = np.full(n, np.nan)
        oto[rows] = cols
        oto_ssim[rows] = pair_ssim(rows, cols)
        out["oto"], out["oto_ssim"] = oto, oto_ssim
    return out
