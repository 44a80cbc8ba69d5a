"""Pooling the restarts of a portfolio into one :class:`~exhume.attacks.Reconstruction`.

1. **Concatenate** every restart's candidates, labels and per-candidate scores (λ).
2. **Rank** each candidate attacker-side (weights and candidates only, never the training set):
   ``rank = explained(restart) × plausibility(candidate)``, where ``explained = 1 − min(r, 1)``
   with ``r`` the restart's final relative stationarity residual (how much of the weights its
   candidates explain; 1 when the attack reports none), and the plausibility is the product of
   the per-candidate terms of :func:`exhume.attacks.score.candidate_terms` (not shrunk to the data
   mean, inside the pixel range, and, for binary tasks with multipliers, a margin consistent
   with its λ).
3. **Merge near-duplicates**: two candidates with the same label whose display-space images
   (clipped to [0, 1], as the evaluator sees them), less the data mean, have a normalised
   cross-correlation (Pearson correlation of the pixels) above ``DUPLICATE_NCC = 0.95`` and, for
   image inputs, an SSIM above ``DUPLICATE_SSIM = 0.98`` with each other are one image (the mean
   is taken out, or candidates still near the mean all correlate); going down the ranking, a candidate
   that is a near-duplicate of one already kept is dropped and counted on the kept one
   (``provenance["merged"]``, and ``provenance["members"][i, k]`` is true when restart ``k``
   produced candidate ``i`` or one of its merged duplicates).

   Why SSIM as well: a candidate is memorised when it beats the best unseen image by SSIM, often
   by a few thousandths, and with the correlation alone the merge dropped such winners
   (``benchmarks/README.md``, "Merging near-duplicates: the correlation alone dropped winners").
4. **Sort** best-first by rank.

Per-candidate provenance (``Reconstruction.provenance``): ``restart``, ``index`` (within its
restart), ``iteration`` (of the kept iterate), ``merged``, ``members`` (candidates × restarts)
and ``rank``. ``config["portfolio"]`` holds every restart's seed, variant, iterations, seconds
and status, and the summary flags starved restarts (:func:`starved`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import torch

from exhume.attacks import Reconstruction
from exhume.evaluation.matching import unit_rows
from exhume.evaluation.ssim import ssim_pairs
from exhume.files import LIMITS

DUPLICATE_NCC = 0.95
#: image candidates are near-duplicates only when their SSIM with each other is above this as well
DUPLICATE_SSIM = 0.98
STARVED_SHARE = 0.5
DEDUP_NOTE = (f"candidates with the same label whose clipped display-space images, less the data mean, correlate "
              f"(Pearson, NCC) above {DUPLICATE_NCC} and (images) have SSIM above {DUPLICATE_SSIM} with each other "
              f"are merged; the better-ranked one is kept")
#: SSIM of at most this many candidate pairs at once (memory: a few float64 copies of each pair's images)
PAIR_CHUNK = 4096
RANK_NOTE = ("attacker-side: (1 - min(r, 1)) of the candidate's restart (r: its final relative stationarity residual) x the "
             "candidate's plausibility (not shrunk to the data mean, in the pixel range, margin consistent with its multiplier)")


def starved(iterations: dict[int, int], share: float = STARVED_SHARE) -> list[int]:
    """Restarts that ran fewer than ``share`` × the median iterations of all restarts (needs 2 or more)."""
    if len(iterations) < 2:
        return []
    med = statistics.median(iterations.values())
    return sorted(k for k, it in iterations.items() if it < share * med)


def near_duplicates(candidates: torch.Tensor, labels: torch.Tensor, order: torch.Tensor,
                    threshold: float = DUPLICATE_NCC, mean: torch.Tensor | None = None,
                    ssim_threshold: float | None = DUPLICATE_SSIM) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy merge going down ``order``: ``(kept indices in order, owner of every candidate)``.

    The correlation is taken on each clipped image's departure from the data ``mean`` (when
    given): candidates that have not yet left the mean are mostly noise there and are not merged,
    while two copies of one reconstructed image are. For image candidates ``(m, C, H, W)`` a pair
    above ``threshold`` is a duplicate only if the SSIM of the two clipped images is above
    ``ssim_threshold`` as well (None: the correlation alone; other inputs: always).

    Memory: the merge goes down ``order`` a block of still-unowned rows at a time (at most
    ``LIMITS.candidates_x_pool_block`` correlations, and so flagged pairs, at once): each block's
    correlations with every candidate are computed, the pairs whose partner is still unowned are
    confirmed by SSIM as each row claims them in order (a partner already claimed is not compared:
    time near-linear when candidates collapse, 20,000 copies of one image in seconds). A long
    portfolio's pool (64 restarts of 2n candidates each) never holds an m × m matrix (12,800 candidates: 1.3 GB in
    float64; 128,000: 131 GB), nor a list of every flagged pair, which is m²/2 pairs when the
    candidates have collapsed onto one image (4 restarts of 4,000 candidates still near the data
    mean: 2.8 GB and over 10 minutes of SSIM on the pair list before; now the first block claims them).
    """
    m = candidates.shape[0]
    clipped = candidates.float().clamp(0, 1)
    c = clipped
    if mean is not None:
        c = c - mean.float().clamp(0, 1).reshape(1, *c.shape[1:])
    z = unit_rows(c.flatten(1))
    del c
    lab = labels.reshape(m, -1)
    confirm = ssim_threshold is not None and clipped.dim() == 4
    rows = max(1, min(m, LIMITS.candidates_x_pool_block // max(m, 1)))
    owner = np.full(m, -1, dtype=np.int64)
    kept: list[int] = []
    sequence = order.tolist()
    at = 0
    while at < len(sequence):
        block = []
        while at < len(sequence) and len(block) < rows:
            if owner[sequence[at]] < 0:
                block.append(sequence[at])
            at += 1
        if not block:
            break
        bi = torch.tensor(block, dtype=torch.long)
        hit = (z[bi] @ z.T).clamp_(-1.0, 1.0) > threshold
        hit &= (lab[bi, None, :] == lab[None, :, :]).all(dim=-1)
        hit &= torch.from_numpy(owner < 0)[None, :]  # an owned candidate is never claimed again
        hit[torch.arange(len(block)), bi] = False
        r, j = torch.nonzero(hit, as_tuple=True)  # row-major: grouped by the block's rows, in order
        del hit
        _claim(block, r.numpy(), j.numpy(), owner, kept, clipped if confirm else None, ssim_threshold)
    return torch.tensor(kept, dtype=torch.long), torch.from_numpy(owner)


def _claim(block: list[int], r: np.ndarray, j: np.ndarray, owner: np.ndarray, kept: list[int], images: torch.Tensor | None,
           ssim_threshold: float | None) -> None:
    """The block's rows, in order, keep themselves (unless claimed already) and claim their flagged partners that are
    still unowned; with ``images``, only those whose SSIM confirms it. A pair whose partner an earlier row claimed is
    never compared, so a collapsed pool costs one SSIM per candidate, not one per pair."""
    bounds = np.searchsorted(r, np.arange(len(block) + 1))
    for k, a in enumerate(block):
        if owner[a] >= 0:  # claimed by an earlier row of this block
            continue
        owner[a] = a
        kept.append(a)
        near = j[bounds[k]:bounds[k + 1]]
        near = near[owner[near] < 0]
        if images is not None and near.size:
            gap = np.concatenate([(images[torch.from_numpy(near[s:s + PAIR_CHUNK])] - images[a]).abs().flatten(1).amax(1).numpy()
                                  for s in range(0, near.size, PAIR_CHUNK)])
            doubt = gap > certain_gap(ssim_threshold)  # the others are above the threshold by the bound: no SSIM needed
            if doubt.any():
                idx = torch.from_numpy(near[doubt])
                doubt[doubt] = ~_confirmed_by_ssim(images, torch.full((idx.numel(),), a), idx, ssim_threshold).numpy()
            near = near[~doubt]
        owner[near] = a


def certain_gap(ssim_threshold: float) -> float:
    """The largest pixel difference (L∞, images in [0, 1]) that guarantees an SSIM above ``ssim_threshold``.

    Every Gaussian window's SSIM is ``l·cs`` with ``1 − l = (μx − μy)²/(μx² + μy² + C1) ≤ ε²/C1`` and
    ``1 − cs = Var_w(x − y)/(σx² + σy² + C2) ≤ ε²/C2`` (the window's weights are non-negative and sum
    to 1), so ``SSIM ≥ 1 − ε²(1/C1 + 1/C2)``; half that ε² for rounding. ``C1 = K1²``, ``C2 = K2²``.
    """
    from exhume.evaluation.ssim import K1, K2

    return math.sqrt(0.5 * max(0.0, 1.0 - ssim_threshold) / (1.0 / K1**2 + 1.0 / K2**2))


def flagged_pairs(flat: torch.Tensor, labels: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs ``i < j`` of rows of ``flat`` (m, d) with the same label whose Pearson correlation is above ``threshold``.

    The correlation of :func:`exhume.evaluation.matching.ncc_matrix` (its :func:`unit_rows`), computed
    over blocks of rows against the rows from the block on.
    """
    m = flat.shape[0]
    if m == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    z = unit_rows(flat)
    lab = labels.reshape(m, -1)
    rows = max(1, min(m, LIMITS.candidates_x_pool_block // max(m, 1)))
    out_i, out_j = [], []
    for s in range(0, m, rows):
        e = min(m, s + rows)
        hit = (z[s:e] @ z[s:].T).clamp_(-1.0, 1.0) > threshold
        hit &= (lab[s:e, None, :] == lab[None, s:, :]).all(dim=-1)
        a, b = torch.nonzero(hit, as_tuple=True)
        upper = b > a  # columns start at row s: the block's own diagonal and below are not pairs
        out_i.append(a[upper] + s)
        out_j.append(b[upper] + s)
    return torch.cat(out_i), torch.cat(out_j)


def _confirmed_by_ssim(images: torch.Tensor, i: torch.Tensor, j: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which pairs ``(i, j)`` (the correlation flagged) have an SSIM above ``threshold`` (a mask)."""
    keep = torch.zeros(i.numel(), dtype=torch.bool)
    for s in range(0, i.numel(), PAIR_CHUNK):
        keep[s:s + PAIR_CHUNK] = ssim_pairs(images[i[s:s + PAIR_CHUNK]], images[j[s:s + PAIR_CHUNK]]) > threshold
    return keep


def rank_scores(view, recon: Reconstruction) -> torch.Tensor:
    """The attacker-side rank of each candidate of one restart (higher is better)."""
    from exhume.attacks.score import candidate_terms

    # the margin-consistency term holds at a stationary point only; the known-start equation's multipliers are free
    stationary = recon.config.get("equation_used", "stationary") == "stationary"
    terms = candidate_terms(view, recon.candidates, recon.labels, recon.scores if stationary else None, recon.config.get("n_guess"))
    r = recon.summary.get("final_relative_stationarity")
    explained = 1.0 if r is None else max(0.0, 1.0 - min(float(r), 1.0))
    per = terms["non_degenerate"] * terms["in_range"]
    if "margin_consistent" in terms:
        per = per * terms["margin_consistent"]
    return (explained * per).float()


def _concat(results: list[tuple[Any, Reconstruction]], view) -> dict[str, torch.Tensor]:
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("candidates", "labels", "scores", "restart", "index", "iteration", "rank")}
    for restart, rec in results:
        m = rec.candidates.shape[0]
        parts["candidates"].append(rec.candidates.float())
        parts["labels"].append(rec.labels)
        parts["scores"].append(rec.scores.float() if rec.scores is not None else torch.full((m,), float("nan")))
        parts["restart"].append(torch.full((m,), restart.index, dtype=torch.long))
        parts["index"].append(torch.arange(m))
        it = rec.provenance.get("iteration")
        kept = rec.summary.get("kept_iteration", rec.summary.get("iterations", -1))  # kkt: the snapshot it returned
        parts["iteration"].append(it.long() if it is not None else torch.full((m,), int(kept)))
        parts["rank"].append(rank_scores(view, rec))
    return {k: torch.cat(v) for k, v in parts.items()}


def pool(view, plan, results: dict[int, Reconstruction], records: dict[int, dict[str, Any]],
         threshold: float = DUPLICATE_NCC) -> Reconstruction:
    """One Reconstruction from the restarts' ``results`` (by restart index), with provenance."""
    done = [(r, results[r.index]) for r in plan.restarts if r.index in results]
    if not done:
        from exhume.errors import ExhumeError

        raise ExhumeError("no restart of the portfolio finished; nothing to pool")
    cat = _concat(done, view)
    order = torch.argsort(-cat["rank"], stable=True)
    kept, owner = near_duplicates(cat["candidates"], cat["labels"], order, threshold, mean=view.mean)
    n_restarts = len(plan.restarts)
    members = torch.zeros(cat["candidates"].shape[0], n_restarts, dtype=torch.bool)
    members[owner, cat["restart"]] = True
    merged = torch.bincount(owner, minlength=owner.shape[0]) - 1
    provenance = {"restart": cat["restart"][kept], "index": cat["index"][kept], "iteration": cat["iteration"][kept],
                  "merged": merged[kept], "members": members[kept], "rank": cat["rank"][kept]}
    has_scores = all(rec.scores is not None for _, rec in done)
    table = [records[r.index] for r in plan.restarts]
    iters = {k: rec["iterations"] for k, rec in enumerate(table) if rec.get("status") == "complete"}
    summary = {
        "iterations": sum(iters.values()),
        "seconds": round(sum(rec.get("seconds", 0.0) for rec in table), 3),
        "restarts": n_restarts,
        "restarts_complete": len(done),
        "iterations_per_restart": [rec.get("iterations") for rec in table],
        "seconds_per_restart": [rec.get("seconds") for rec in table],
        "starved_restarts": starved(iters),
        "starved_rule": f"fewer than {STARVED_SHARE:g} x the median iterations of the restarts",
        "candidates_before_merge": int(cat["candidates"].shape[0]),
        "candidates": int(kept.shape[0]),
        "final_relative_stationarity_per_restart": [rec.get("final_relative_stationarity") for rec in table],
    }
    return Reconstruction(
        method=plan.method, candidates=cat["candidates"][kept], labels=cat["labels"][kept],
        scores=cat["scores"][kept] if has_scores else None, config=_config(plan, done, table, threshold),
        seed=plan.seed, summary=summary, provenance=provenance)


def _config(plan, done, table, threshold: float) -> dict[str, Any]:
    """The settings all restarts share, and the portfolio table (per-restart seeds, variants, budgets)."""
    configs = [rec.config for _, rec in done]
    common = {k: v for k, v in configs[0].items() if all(k in c and c[k] == v for c in configs[1:])}
    varied = sorted({k for c in configs for k in c} - set(common))
    return {**common, "portfolio": {
        "restarts": table, "varied_settings": varied, "max_seconds": plan.max_seconds, "workers": plan.workers,
        "merge": DEDUP_NOTE if threshold == DUPLICATE_NCC else DEDUP_NOTE.replace(str(DUPLICATE_NCC), str(threshold)),
        "merge_threshold": threshold, "merge_ssim": DUPLICATE_SSIM, "rank": RANK_NOTE}}


def restart_record(restart, recon: Reconstruction | None, status: str, host: str | None = None) -> dict[str, Any]:
    """One row of ``config["portfolio"]["restarts"]``."""
    row: dict[str, Any] = {"restart": restart.index, "seed": restart.seed, "overrides": restart.overrides, "status": status}
    if recon is not None:
        row.update(iterations=int(recon.summary.get("iterations", 0)), seconds=recon.summary.get("seconds"),
                   candidates=int(recon.candidates.shape[0]),
                   final_relative_stationarity=recon.summary.get("final_relative_stationarity"))
    if host is not None:
        row["host"] = host
    return row
