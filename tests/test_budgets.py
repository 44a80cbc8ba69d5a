"""Budgets kept: the pool's merge near-linear when candidates collapse, the SSIM bound it uses equal to SSIM's
verdict, and a progress line that never shows more seconds than its budget as a fraction of it."""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest
import torch

from exhume.evaluation.ssim import ssim_pairs
from exhume.portfolio.pool import DUPLICATE_SSIM, certain_gap, near_duplicates

pool_mod = sys.modules["exhume.portfolio.pool"]  # the package exports a function named pool


@pytest.mark.parametrize("noise", [0.0, 1e-4])
def test_twenty_thousand_collapsed_candidates_merge_in_seconds(noise):
    """A portfolio whose restarts all collapsed onto one image: one SSIM-free pass, not 2e8 pairs of SSIM."""
    g = torch.Generator().manual_seed(0)
    image = torch.rand(1, 1, 28, 28, generator=g)
    cands = image.repeat(20_000, 1, 1, 1) + noise * torch.randn(20_000, 1, 28, 28, generator=g)
    t0 = time.perf_counter()
    kept, owner = near_duplicates(cands, torch.ones(20_000), torch.arange(20_000), mean=torch.full((1, 28, 28), 0.1))
    seconds = time.perf_counter() - t0
    assert kept.tolist() == [0] and bool((owner == 0).all()) and seconds < 10.0, seconds


def test_the_pixel_bound_never_accepts_a_pair_ssim_would_refuse():
    """Pairs at the bound's largest difference, in the worst patterns (checkerboard, a flat image, random signs):
    SSIM is above the threshold for every one."""
    g = torch.Generator().manual_seed(1)
    eps = certain_gap(DUPLICATE_SSIM)
    a = torch.cat([torch.rand(64, 1, 28, 28, generator=g), torch.zeros(4, 1, 28, 28), torch.full((4, 1, 28, 28), 0.5)]).double()
    checker = (torch.arange(28)[:, None] + torch.arange(28)[None, :]) % 2 * 2.0 - 1.0
    signs = torch.cat([torch.randint(0, 2, (64, 1, 28, 28), generator=g) * 2.0 - 1.0, checker.expand(8, 1, 28, 28)]).double()
    b = (a + eps * signs).clamp(0, 1)
    assert float((a - b).abs().max()) <= eps + 1e-9
    assert float(ssim_pairs(a, b).min()) > DUPLICATE_SSIM
    assert float(ssim_pairs(a, (a + 20 * eps * signs).clamp(0, 1)).min()) < DUPLICATE_SSIM  # the bound is not vacuous


def test_the_merge_with_the_bound_equals_the_greedy_rule_on_dense_ncc_and_ssim(monkeypatch):
    """Clusters at several noise levels, some above the bound (SSIM decides) and some below it, in small blocks."""
    from exhume.evaluation.matching import ncc_matrix
    from exhume.evaluation.ssim import ssim_matrix

    g = torch.Generator().manual_seed(2)
    centres = torch.rand(6, 1, 12, 12, generator=g)
    noise = torch.tensor([0.0, 3e-4, 2e-3, 1e-2, 3e-2, 1e-1]).repeat_interleave(10)
    cands = (centres.repeat(10, 1, 1, 1) + noise[:, None, None, None] * torch.randn(60, 1, 12, 12, generator=g)).clamp(0, 1)
    labels = torch.ones(60)
    order = torch.randperm(60, generator=g)
    mean = torch.full((1, 12, 12), 0.4)
    flat = (cands - mean).reshape(60, 1, 1, -1)
    dense = (ncc_matrix(flat, flat) > 0.95) & (ssim_matrix(cands, cands) > DUPLICATE_SSIM)
    owner_ref = torch.full((60,), -1, dtype=torch.long)
    for a in order.tolist():
        if owner_ref[a] < 0:
            owner_ref[a] = a
            owner_ref[(owner_ref < 0) & dense[a]] = a
    monkeypatch.setattr(pool_mod, "LIMITS", dataclasses.replace(pool_mod.LIMITS, candidates_x_pool_block=7 * 60))
    kept, owner = near_duplicates(cands, labels, order, mean=mean)
    assert torch.equal(owner, owner_ref) and 6 < len(kept) < 60
    assert kept.tolist() == [a for a in order.tolist() if owner_ref[a] == a]


@pytest.mark.parametrize("elapsed, shown", [(12.2, "12/17 s"), (17.0, "17/17 s"), (18.4, "18 s (1.4 s over the 17-s budget)")])
def test_a_progress_line_never_shows_more_seconds_than_its_budget_as_a_fraction(capsys, elapsed, shown):
    from exhume.progress import Progress

    bar = Progress("kkt attack", 100, 17.0, start=40, elapsed=elapsed)  # stderr is not a terminal here: plain lines
    bar.close()
    line = capsys.readouterr().err
    assert line == f"kkt attack: it 40/100, {shown}\n"
