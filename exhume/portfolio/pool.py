"""Pooling the restarts of a portfolio into one :class:`~exhume.attacks.Reconstruction`.

1. **Concatenate** every restart's candidates, labels and per-candidate scores (λ).
2. **Rank** each candidate attacker-side (weights and candidates only, never the training set):
   ``rank = explained(restart) × plausibility(candidate)``, where ``explained = 1 − min(r, 1)``
   with ``r`` the restart's final relative stationarity residual (how much of the weights its
   candidates explain; 1 when the attack reports none), and the plausibility is the product of
   the per-candidate terms of :func:`exhume.attacks.engine.score.candidate_terms` (not shrunk to the data
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
   (``docs/defaults.md#portfolio-merge``).
4. **Sort** best-first by rank.

Per-candidate provenance (``Reconstruction.provenance``): ``restart``, ``index`` (within its
restart), ``iteration`` (of the kept iterate), ``merged``, ``members`` (candidates × restarts)
and ``rank``. The record's :class:`~exhume.attacks.PortfolioRecord` holds every restart's seed, variant,
iterations, seconds and status, and flags starved restarts (:func:`starved`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from exhume.attacks import PortfolioRecord, Reconstruction, RestartRecord, RunRecord
from exhume.evaluation.matching import unit_rows
from exhume.evaluation.ssim import ssim_pairs_separable
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

    Time and memory: candidates are merged only within their label, so each label's candidates are
    taken apart, in ``order``. Every candidate ranked above another has been decided (kept, or
    claimed) when that one's row comes, so a block of rows is correlated with the still-unowned
    candidates ranked at or below it only: at most half the pairs, in float32 (pairs within the
    float32 rounding bound of ``threshold`` are decided again in float64, the rule of
    :func:`exhume.evaluation.matching.ncc_matrix`). At most ``LIMITS.candidates_x_pool_block``
    correlations are held at once, never an m × m matrix. The pairs a row flags are confirmed (pixel
    bound, then SSIM) for many rows at once (:func:`_claim`), and a partner already claimed is
    never compared: 20,000 copies of one image, or 20,000 distinct images, merge in seconds
    (``benchmarks/pool_merge.py``).
    """
    m = candidates.shape[0]
    clipped = candidates.float().clamp(0, 1)
    c = clipped
    if mean is not None:
        c = c - mean.float().clamp(0, 1).reshape(1, *c.shape[1:])
    flat = c.flatten(1)
    z = flat - flat.mean(1, keepdim=True)  # the rows of unit_rows in float32: a screen, the doubtful pairs redone in float64
    z = torch.where(z.norm(dim=1, keepdim=True) > 0, z / z.norm(dim=1, keepdim=True).clamp_min(1e-30), torch.zeros_like(z))
    confirm = ssim_threshold is not None and clipped.dim() == 4
    owner = np.full(m, -1, dtype=np.int64)
    seq = order.reshape(-1).long()
    _, group = torch.unique(labels.reshape(m, -1), dim=0, return_inverse=True)
    seq = seq[torch.argsort(group[seq], stable=True)]  # label by label, each in `order`
    sizes = torch.bincount(group[seq]).tolist()
    for idx in torch.split(seq, [s for s in sizes if s > 0]):
        if idx.numel() == 1:
            owner[int(idx)] = int(idx)
            continue
        _merge_label(z[idx], flat[idx], clipped[idx] if confirm else None, idx.numpy(), owner, threshold, ssim_threshold)
    kept = [a for a in order.reshape(-1).tolist() if owner[a] == a]
    return torch.tensor(kept, dtype=torch.long), torch.from_numpy(owner)


def _merge_label(z32: torch.Tensor, flat: torch.Tensor, images: torch.Tensor | None, ids: np.ndarray, owner: np.ndarray,
                 threshold: float, ssim_threshold: float | None) -> None:
    """The greedy merge of one label's candidates (rows of ``z32``, their unit rows in float32, and of ``flat``, in
    rank order; ``ids`` their indices in the pool)."""
    g = z32.shape[0]
    slack = 4.0 * (z32.shape[1] + 2) * 2.0 ** -24  # bound on the error of a float32 correlation (normalising and dot)
    screen = _Screen(z32, slack) if g >= SCREEN_MIN else None
    local = np.full(g, -1, dtype=np.int64)
    s = 0
    while s < g:
        cols = s + np.flatnonzero(local[s:] < 0)  # the still-unowned candidates ranked at or below row s
        rows = max(1, LIMITS.candidates_x_pool_block // max(cols.size, 1))
        block = [i for i in range(s, min(g, s + rows)) if local[i] < 0]
        s += rows
        if not block:
            continue
        bi = torch.tensor(block, dtype=torch.long)
        whole = 2 * cols.size >= g - (s - rows)  # mostly unowned: every row from the block's on, the owned ones masked
        if whole:
            cols = np.arange(s - rows, g)
        r, j, near = _correlated(z32, bi, torch.from_numpy(cols), threshold - slack, screen)
        if whole:
            unowned = local[cols[j.numpy()]] < 0
            r, j, near = r[unowned], j[unowned], near[unowned]
        if screen is not None and screen.failed:
            screen = None  # candidates the bound cannot tell apart (noise): dense blocks from here on
        doubt = (near <= threshold + slack).numpy()
        if doubt.any():  # decided again in float64
            exact = ((unit_rows(flat[bi[r[doubt]]]) * unit_rows(flat[cols[j[doubt].numpy()]])).sum(1) > threshold).numpy()
            keep = np.ones(r.numel(), dtype=bool)
            keep[doubt] = exact
            r, j = r[keep], j[keep]
        _claim(block, r.numpy(), cols[j.numpy()], local, images, ssim_threshold)
    owner[ids] = ids[local]


#: a label with at least this many candidates is screened by a bound (:class:`_Screen`) before its correlations
SCREEN_MIN = 1024
#: ... and a block whose pairs pass the screen more often than this is correlated densely instead
SCREEN_DENSE_SHARE = 0.002


class _Screen:
    """An upper bound on every correlation of unit rows, from a ``k``-dimensional orthonormal basis ``P`` (about the
    leading principal directions of a sample of rows, by one randomised power step; any orthonormal basis keeps the
    bound): ``z_i·z_j ≤ Pz_i·Pz_j + ‖z_i − P'Pz_i‖‖z_j − P'Pz_j‖`` (Cauchy-Schwarz on the part outside the span).
    Pairs the bound rules out are never correlated in full: reconstructions of distinct images mostly differ inside
    a few directions. Noise does not, and gets dense blocks."""

    def __init__(self, z32: torch.Tensor, slack: float, k: int = 96, sample: int = 2048) -> None:
        g, d = z32.shape
        rows = z32[torch.linspace(0, g - 1, min(g, sample)).long()]
        probe = torch.randn(d, min(k, d), generator=torch.Generator().manual_seed(0))
        self.basis, _ = torch.linalg.qr(rows.T @ (rows @ probe))  # the sample's leading directions, orthonormal (d, k)
        self.y = z32 @ self.basis
        outside = ((z32 * z32).sum(1) - (self.y * self.y).sum(1)).clamp_min(0.0)
        self.q = (outside + slack).sqrt()  # never below the true norm outside the span
        self.failed = False


def _correlated(z32: torch.Tensor, bi: torch.Tensor, ci: torch.Tensor, cut: float, screen: _Screen | None):
    """``(r, j, correlation)`` of the pairs (row ``bi[r]``, column ``ci[j]``, row-major) whose float32 correlation is
    above ``cut``, a row never with itself."""
    if screen is not None:
        bound = screen.y[bi] @ screen.y[ci].T + screen.q[bi, None] * screen.q[None, ci] > cut
        bound[bi[:, None] == ci[None, :]] = False
        if int(bound.sum()) <= SCREEN_DENSE_SHARE * bound.numel():
            r, j = torch.nonzero(bound, as_tuple=True)
            near = (z32[bi[r]] * z32[ci[j]]).sum(1)
            hit = near > cut
            return r[hit], j[hit], near[hit]
        screen.failed = True
    contiguous = bool(ci.numel()) and int(ci[-1] - ci[0]) + 1 == ci.numel()
    dots = z32[bi] @ (z32[int(ci[0]):int(ci[-1]) + 1] if contiguous else z32[ci]).T
    hit = dots > cut
    hit[bi[:, None] == ci[None, :]] = False
    r, j = torch.nonzero(hit, as_tuple=True)
    return r, j, dots[r, j]


def _claim(block: list[int], r: np.ndarray, j: np.ndarray, owner: np.ndarray, images: torch.Tensor | None,
           ssim_threshold: float | None) -> None:
    """The block's rows, in order, keep themselves (unless claimed already) and claim their flagged partners ``j``
    (grouped by row ``r``) that are still unowned; with ``images``, only those whose SSIM confirms it.

    The confirmations are computed for a run of rows at once (their partners still unowned when the run begins, at
    most ``PAIR_CHUNK`` pairs unless one row has more); a run ends before a row that an earlier row of it flagged (that
    row may be claimed), so no comparison is made for a row that is then claimed. A pair whose partner was claimed before its run is never
    compared, so a collapsed pool costs one comparison per candidate, not one per pair."""
    bounds = np.searchsorted(r, np.arange(len(block) + 1))
    flagged = np.zeros(owner.size, dtype=bool)  # partners flagged by a row of the current run
    k = 0
    while k < len(block):
        run, pairs, count = [], [], 0
        while k < len(block) and (not run or (count < PAIR_CHUNK and not flagged[block[k]])):
            a = block[k]
            near = j[bounds[k]:bounds[k + 1]]
            near = near[owner[near] < 0]
            if owner[a] < 0:
                run.append((a, len(pairs)))
                pairs.append(near)
                count += near.size
                flagged[near] = True
            k += 1
        for near in pairs:
            flagged[near] = False
        ok = _confirmed([(a, pairs[i]) for a, i in run], images, ssim_threshold) if images is not None else None
        at = 0
        for a, i in run:
            near = pairs[i]
            if owner[a] >= 0:  # claimed by an earlier row of this run
                at += near.size
                continue
            owner[a] = a
            sure = ok[at:at + near.size] if ok is not None else np.ones(near.size, dtype=bool)
            at += near.size
            near = near[sure & (owner[near] < 0)]
            owner[near] = a


def _confirmed(run: list[tuple[int, np.ndarray]], images: torch.Tensor, ssim_threshold: float) -> np.ndarray:
    """Whether each pair ``(a, b)`` of the run (every ``b`` of each ``(a, bs)``, in order) is a duplicate by the
    pixel bound (:func:`certain_gap`) or, where the bound cannot tell, by SSIM."""
    if sum(bs.size for _, bs in run) == 0:
        return np.zeros(0, dtype=bool)
    a = torch.from_numpy(np.concatenate([np.full(bs.size, x, dtype=np.int64) for x, bs in run]))
    b = torch.from_numpy(np.concatenate([bs for _, bs in run]).astype(np.int64))
    gap = torch.cat([(images[a[s:s + PAIR_CHUNK]] - images[b[s:s + PAIR_CHUNK]]).abs().flatten(1).amax(1)
                     for s in range(0, a.numel(), PAIR_CHUNK)])
    ok = gap <= certain_gap(ssim_threshold)  # above the SSIM threshold by the bound: no SSIM needed
    if not bool(ok.all()):
        doubt = ~ok
        ok[doubt] = _confirmed_by_ssim(images, a[doubt], b[doubt], ssim_threshold)
    return ok.numpy()


def certain_gap(ssim_threshold: float) -> float:
    """The largest pixel difference (L∞, images in [0, 1]) that guarantees an SSIM above ``ssim_threshold``.

    Every Gaussian window's SSIM is ``l·cs`` with ``1 − l = (μx − μy)²/(μx² + μy² + C1) ≤ ε²/C1`` and
    ``1 − cs = Var_w(x − y)/(σx² + σy² + C2) ≤ ε²/C2`` (the window's weights are non-negative and sum
    to 1), so ``SSIM ≥ 1 − ε²(1/C1 + 1/C2)``; half that ε² for rounding. ``C1 = K1²``, ``C2 = K2²``.
    """
    from exhume.evaluation.ssim import K1, K2

    return math.sqrt(0.5 * max(0.0, 1.0 - ssim_threshold) / (1.0 / K1**2 + 1.0 / K2**2))


def _confirmed_by_ssim(images: torch.Tensor, i: torch.Tensor, j: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which pairs ``(i, j)`` (the correlation flagged) have an SSIM above ``threshold`` (a mask)."""
    keep = torch.zeros(i.numel(), dtype=torch.bool)
    for s in range(0, i.numel(), PAIR_CHUNK):
        keep[s:s + PAIR_CHUNK] = ssim_pairs_separable(images[i[s:s + PAIR_CHUNK]], images[j[s:s + PAIR_CHUNK]], check=False) > threshold
    return keep


def rank_scores(view, recon: Reconstruction) -> torch.Tensor:
    """The attacker-side rank of each candidate of one restart (higher is better)."""
    from exhume.attacks.engine.score import candidate_terms

    # the margin-consistency term holds at a stationary point only; the known-start equation's multipliers are free
    record = recon.record
    terms = candidate_terms(view, recon.candidates, recon.labels, recon.scores if record.equation.stationary else None, record.n_guess)
    r = record.final_relative_stationarity
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
        record = rec.record  # kkt: the snapshot it returned
        kept = record.kept_iteration if record.kept_iteration is not None else record.iterations if record.iterations is not None else -1
        parts["iteration"].append(it.long() if it is not None else torch.full((m,), int(kept)))
        parts["rank"].append(rank_scores(view, rec))
    return {k: torch.cat(v) for k, v in parts.items()}


def pool(view, plan, results: dict[int, Reconstruction], records: dict[int, RestartRecord],
         threshold: float = DUPLICATE_NCC) -> Reconstruction:
    """One Reconstruction from the restarts' ``results`` and table rows ``records`` (by restart index), with provenance."""
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
    table = tuple(records[r.index] for r in plan.restarts)
    iters = {k: row.iterations for k, row in enumerate(table) if row.status == "complete"}
    shared, varied = _shared([rec.record for _, rec in done])
    portfolio = PortfolioRecord(
        restarts=table, starved_restarts=tuple(starved(iters)),
        starved_rule=f"fewer than {STARVED_SHARE:g} x the median iterations of the restarts",
        candidates_before_merge=int(cat["candidates"].shape[0]), candidates=int(kept.shape[0]), pooling={
            "varied_settings": varied, "max_seconds": plan.max_seconds, "workers": plan.workers,
            "merge": DEDUP_NOTE if threshold == DUPLICATE_NCC else DEDUP_NOTE.replace(str(DUPLICATE_NCC), str(threshold)),
            "merge_threshold": threshold, "merge_ssim": DUPLICATE_SSIM, "rank": RANK_NOTE})
    record = replace(shared, iterations=sum(iters.values()), seconds=round(sum(row.seconds or 0.0 for row in table), 3), portfolio=portfolio)
    return Reconstruction(
        method=plan.method, candidates=cat["candidates"][kept], labels=cat["labels"][kept],
        scores=cat["scores"][kept] if has_scores else None, record=record, seed=plan.seed, provenance=provenance)


def _shared(records: list[RunRecord]) -> tuple[RunRecord, list[str]]:
    """What every restart's record states alike (its settings, threat model, equation, init...; a typed entry that differs
    is left unstated), and the names of the saved config entries that differ."""
    first, configs = records[0], [r.config_json() for r in records]
    common = {k for k, v in configs[0].items() if all(k in c and c[k] == v for c in configs[1:])}
    typed = {k: getattr(first, k) for k in ("equation", "threat_model", "init", "start_unused", "batched_restarts")
             if all(getattr(r, k) == getattr(first, k) for r in records)}
    return RunRecord(**typed, settings={k: v for k, v in first.settings.items() if k in common}), sorted({k for c in configs for k in c} - common)


def restart_record(restart, recon: Reconstruction | None, status: str, host: str | None = None, **more: Any) -> RestartRecord:
    """One row of the portfolio's table (``more``: its ``error``, ``batch``, ``iterations`` without a result)."""
    if recon is not None:
        record = recon.record
        more.update(iterations=int(record.iterations or 0), seconds=record.seconds, candidates=int(recon.candidates.shape[0]),
                    final_relative_stationarity=record.final_relative_stationarity)
    return RestartRecord(restart=restart.index, status=status, seed=restart.seed, overrides=restart.overrides, host=host, **more)
