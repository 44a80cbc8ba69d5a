"""Budgets kept: a portfolio with spawned workers returns within its time budget (probe, start-up, pooling and saving
included), a deadline stops a run whatever its step budget, restarts end with their wave; the pool's merge
fast on 20,000 candidates (collapsed or distinct) and equal to the greedy rule on dense matrices with and without its
screen; the SSIM bound it uses equal to SSIM's verdict; a progress line that never shows more seconds than its budget
as a fraction of it."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import exhume
from exhume.evaluation.ssim import ssim_pairs, ssim_pairs_separable
from exhume.portfolio.pool import DUPLICATE_SSIM, certain_gap, near_duplicates

pool_mod = sys.modules["exhume.portfolio.pool"]  # the package exports a function named pool


@pytest.mark.parametrize("noise", [0.0, 1e-4])
def test_twenty_thousand_collapsed_candidates_merge_in_seconds_of_one_core(noise, one_thread):
    """A portfolio whose restarts all collapsed onto one image: one SSIM-free pass, not 2e8 pairs of SSIM. CPU time of
    one thread (measured 1.0-1.1 s, idle or beside four CPU-bound jobs, where the wall time reached 9.6 s of the 10 it
    was once allowed)."""
    g = torch.Generator().manual_seed(0)
    image = torch.rand(1, 1, 28, 28, generator=g)
    cands = image.repeat(20_000, 1, 1, 1) + noise * torch.randn(20_000, 1, 28, 28, generator=g)
    t0 = time.process_time()
    kept, owner = near_duplicates(cands, torch.ones(20_000), torch.arange(20_000), mean=torch.full((1, 28, 28), 0.1))
    seconds = time.process_time() - t0
    assert kept.tolist() == [0] and bool((owner == 0).all()) and seconds < 5.0, seconds


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


@pytest.mark.parametrize("screen", [False, True])
def test_the_merge_with_the_bound_equals_the_greedy_rule_on_dense_ncc_and_ssim(monkeypatch, screen):
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
    monkeypatch.setattr(pool_mod, "SCREEN_MIN", 2 if screen else 10**9)  # the subspace bound before the correlations
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


MNIST = Path(exhume.__file__).parent / "data" / "mnist_subset.npz"


def _digits():
    d = np.load(MNIST)
    return torch.from_numpy(d["images"]).float().div(255).unsqueeze(1), torch.from_numpy(d["labels"] % 2).float()


def test_twenty_thousand_distinct_candidates_merge_in_under_five_seconds_of_one_core():
    """A portfolio's pool of distinct images (10,000 digits and their mirror images, odd/even): the subspace bound
    rules out nearly every pair, so the merge is far from the m² correlations of 784 pixels (one thread, CPU time)."""
    digits, labels = _digits()
    cands, labs = torch.cat([digits, digits.flip(-1)]), torch.cat([labels, labels])
    order = torch.randperm(20_000, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.process_time()
        kept, owner = near_duplicates(cands, labs, order, mean=digits.mean(0))
        seconds = time.process_time() - t0
    finally:
        torch.set_num_threads(threads)
    assert seconds < 5.0, seconds
    assert 19_900 < len(kept) < 20_000  # a few true look-alikes (a digit equal to its mirror image) merge
    merged = (owner != torch.arange(20_000)).nonzero().flatten()
    assert bool((labs[merged] == labs[owner[merged]]).all())


def test_the_screened_merge_equals_the_greedy_rule_on_a_dense_correlation_matrix(monkeypatch):
    """Digits, noisy copies of them and noise, 1,500 of each label (the screen on, its dense fallback for noise),
    against the greedy rule on the full float64 correlation matrix (the correlation alone)."""
    from exhume.evaluation.matching import ncc_matrix

    digits, labels = _digits()
    g = torch.Generator().manual_seed(3)
    base = digits[:1000]
    noisy = (base + torch.tensor([0.0, 0.01, 0.03, 0.1]).repeat(250)[:, None, None, None] * torch.randn(base.shape, generator=g)).clamp(0, 1)
    noise = (digits.mean(0) + 0.1 * torch.randn(1000, 1, 28, 28, generator=g)).clamp(0, 1)
    cands = torch.cat([base, noisy, noise])
    labs = torch.cat([labels[:1000], labels[:1000], (torch.arange(1000) % 2).float()])
    order = torch.randperm(3000, generator=g)
    mean = digits.mean(0)
    monkeypatch.setattr(pool_mod, "LIMITS", dataclasses.replace(pool_mod.LIMITS, candidates_x_pool_block=200_000))
    kept, owner = near_duplicates(cands, labs, order, mean=mean, ssim_threshold=None)
    flat = (cands - mean).reshape(3000, 1, 1, -1)
    dense = (ncc_matrix(flat, flat) > 0.95) & (labs[:, None] == labs[None, :])
    ref = torch.full((3000,), -1, dtype=torch.long)
    for a in order.tolist():
        if ref[a] < 0:
            ref[a] = a
            ref[(ref < 0) & dense[a]] = a
    assert torch.equal(owner, ref) and 1500 < len(kept) < 2900


def test_ssim_pairs_separable_equals_ssim_pairs():
    g = torch.Generator().manual_seed(4)
    for shape in [(50, 1, 28, 28), (20, 3, 32, 32), (30, 1, 8, 8)]:
        a = torch.rand(shape, generator=g)
        b = (a + 0.05 * torch.randn(shape, generator=g)).clamp(0, 1)
        assert torch.allclose(ssim_pairs_separable(a, b), ssim_pairs(a, b), atol=1e-12, rtol=0)


def test_restarts_end_with_their_wave():
    from exhume.deadline import NEVER, Deadline
    from exhume.portfolio.plan import make_plan
    from exhume.portfolio.runner import restart_ends

    plan = make_plan("kkt", 5, max_seconds=30.0, workers=2)
    now = time.time()
    ends = restart_ends(list(plan.restarts), 2, Deadline.after(30.0))
    assert [round(ends[k].at - now) for k in range(5)] == [10, 10, 20, 20, 30]
    assert restart_ends(list(plan.restarts), 2, NEVER) == dict.fromkeys(range(5), NEVER)


def test_a_deadline_stops_a_run_whatever_its_step_budget(victim_dir):
    from exhume.attacks import get_attack
    from exhume.deadline import Deadline
    from exhume.portfolio.plan import make_plan
    from exhume.portfolio.runner import UNFINISHED, run_restart

    view = exhume.load_victim(victim_dir).attacker_view()
    t0 = time.perf_counter()
    get_attack("kkt", iterations=1).run(view, progress=False)
    one = time.perf_counter() - t0  # a whole run of one step on this machine now: set-up, the step and the wrap-up
    budget = 1.5 + 2 * one  # the set-up and many steps on this machine now (beside four CPU-bound jobs a fixed 1.5 s
    # left one step, and the run stopped at 2.69 s)
    t0 = time.perf_counter()
    recon = get_attack("kkt", iterations=10_000_000).run(view, progress=False, deadline=Deadline.after(budget))
    assert time.perf_counter() - t0 < budget + 2 * one + 0.5 and recon.summary["iterations"] > 1  # a step and the wrap-up past it
    late = make_plan("kkt", 1, max_seconds=60.0, workers=1).restarts[0]
    past = Deadline.after(1.0, since=time.time() - 2.0)
    recon, row = run_restart(view, "kkt", late, None, False, "cpu", False, end=past, deadline=past)
    assert recon is None and row.status == UNFINISHED  # started after the deadline: not run, not stored
    # the portfolio's first restart in this process: one iteration past the deadline, so a budget spent before any
    # restart began (set-up, the sizing probe) still gives candidates, not "no restart finished"
    t0 = time.perf_counter()
    recon, row = run_restart(view, "kkt", late, None, False, "cpu", False, end=past, deadline=past, at_least_one=True)
    assert recon is not None and recon.summary["iterations"] == 1 and recon.candidates.shape[0] > 0
    assert row.status != UNFINISHED and time.perf_counter() - t0 < 2 * one + 2.0  # a one-step run


@pytest.mark.slow
def test_a_portfolio_with_spawned_workers_keeps_a_10_second_budget(victim_dir, monkeypatch, tmp_path):
    """Everything inside the budget: the sizing probe, spawned interpreters importing torch (seconds idle, tens of
    seconds on a loaded 2-core machine), the restarts, pooling and saving. This process runs one restart of every
    wave itself, so the portfolio has results even when the workers start too late to finish one. (One wave of two
    restarts at 10 s as at 20 s; measured with 20 s beside four CPU-bound jobs: 20.3-20.4 s, the worker unfinished.)"""
    import exhume.portfolio.runner as runner

    monkeypatch.setattr(runner, "start_method", lambda device: "spawn")  # the path of GPUs and macOS
    victim = exhume.load_victim(victim_dir)
    t0 = time.perf_counter()
    r = exhume.attack(victim, "kkt", max_seconds=10.0, workers=2, out=tmp_path / "run", progress=False)
    wall = time.perf_counter() - t0
    assert wall < 15.0, wall
    table = r.config["portfolio"]["restarts"]
    assert r.summary["restarts"] >= 2 and table[0]["status"] == "complete"
    assert {row["status"] for row in table} <= {"complete", runner.UNFINISHED}
    assert all((row.get("seconds") or 0) < 10.0 for row in table)
    assert (tmp_path / "run" / "reconstruction.json").is_file() and r.candidates.shape[0] > 0


@pytest.fixture(scope="module")
def leaky_audit_inputs(leaky_victim_dir):
    """The leaky tiny victim of conftest.py as a user's model and arrays: 20 training digits, 300 unseen ones."""
    from exhume.data import dataset_of, make_pool

    victim = exhume.load_victim(leaky_victim_dir)
    train = victim.load_train_set()
    unseen = make_pool(dataset_of(victim.data_spec), "odd-even", 300, exclude=train.indices, seed=3)
    labels = (train.y.numpy() > 0).astype(np.int64)
    return victim.model, (train.x.numpy(), labels), unseen.x.numpy(), {"loss": "logistic", "weight_decay": 5e-3,
                                                                       "normalize": (train.mean, 1.0)}


def test_an_audit_keeps_its_budget_with_its_judging_and_owner_checks_inside(leaky_audit_inputs, tmp_path, one_thread):
    """max_seconds is the whole audit's wall time: the membership exposure runs before the attack, the judging's
    estimate is kept aside, and the attack gets the rest; the owner's figures are all there."""
    from exhume.evaluation.cost import RESERVE_FLOOR

    model, train, unseen, settings = leaky_audit_inputs
    t0 = time.perf_counter()
    r = exhume.audit(model, train, unseen, max_seconds=15.0, out=tmp_path / "audit", progress=False,
                     attack_args={"workers": 1}, **settings)
    wall = time.perf_counter() - t0
    b = r.metrics["audit"]["budget"]
    # within S + 5 s; on a machine so loaded that the fixed work leaves the attack under half of S, within what the
    # warning line promised (the fixed work, the estimate and half of S) + 5 s
    promised = 15.0 if b["covered"] else b["before_attack_seconds"] + b["attack_budget_seconds"] + b["judging_estimate_seconds"]["total"]
    assert wall <= promised + 5.0, (wall, b)
    assert b["judging_estimate_seconds"]["total"] >= RESERVE_FLOOR
    # the deadline the attack was handed is the share recorded: the portfolio's probe and restarts divide exactly that
    sizing = r.metrics["attack"]["config"]["portfolio"]["sizing"]
    assert sizing["probe_seconds"] + sizing["seconds"] == pytest.approx(b["attack_budget_seconds"], abs=0.02)
    assert b["attack_seconds"] <= b["attack_budget_seconds"] + 1.0  # the attack kept its share
    assert b["before_attack_seconds"] + b["attack_seconds"] + b["judging_seconds"] == pytest.approx(b["wall_seconds"], abs=0.5)
    assert r.metrics["identifiability"]["attack_to_truth"] is not None
    # the weights single out this victim's members: AUC 0.91 measured (2026-12-07); a score blind to them gives 0.5
    assert r.metrics["membership_exposure"]["n_nonmembers"] == 300
    assert r.metrics["membership_exposure"]["scores"]["gradient_alignment"]["auc"]["value"] > 0.8
    saved = (tmp_path / "audit" / "evaluation" / "metrics.json").read_text()
    assert '"attack_budget_seconds"' in saved and (tmp_path / "audit" / "evaluation" / "membership_roc.png").is_file()


def test_a_budget_too_small_for_the_audits_fixed_work_says_so_and_keeps_half_for_the_attack(leaky_audit_inputs, capsys,
                                                                                           one_thread):
    from exhume.audit.budget import MIN_ATTACK_SHARE

    model, train, unseen, settings = leaky_audit_inputs
    r = exhume.audit(model, train, unseen, max_seconds=1.0, progress=False, attack_args={"workers": 1, "restarts": 1}, **settings)
    b = r.metrics["audit"]["budget"]
    assert not b["covered"] and b["attack_budget_seconds"] == MIN_ATTACK_SHARE * 1.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the audit's budget of 1 s does not cover its fixed work"), err
    assert "--max-seconds" in err[0] and b["attack_seconds"] <= b["attack_budget_seconds"] + 2.0  # the attack kept its half


def test_the_audit_budgets_split_gives_the_attack_what_is_left_and_at_least_half():
    from exhume.audit.budget import AuditBudget

    b = AuditBudget.split(100.0, 4.0, {"total": 16.0})
    assert b.attack == 80.0 and b.covered and b.warning() is None
    short = AuditBudget.split(20.0, 8.0, {"total": 6.0})
    assert short.attack == 10.0 and not short.covered and "--max-seconds 28 or more" in short.warning()
    rounded = AuditBudget.split(100.0, 4.236, {"total": 10.001})  # 4.24 + 85.76 + 10.001 = 100.001: covered all the same
    assert rounded.attack == 85.76 and rounded.covered and rounded.warning() is None


def test_the_demo_keeps_its_two_budgets_together_taking_what_came_before_from_its_attack(victim_dir, one_thread):
    """The demo's attack gets its own budget, or what is left of training's and attack's budgets together after what
    came before it and the evaluation's estimate, never under half its own."""
    from exhume.deadline import Deadline
    from exhume.demo import _attack_budget

    victim = exhume.load_victim(victim_dir)
    b = _attack_budget(victim, 360.0, Deadline.after(2000.0, since=time.time() - 1700.0))  # 1,700 s of a 1,640-s training budget spent
    estimate = b["evaluation_estimate_seconds"]["total"]
    left = 2000.0 - b["before_attack_seconds"] - estimate
    assert estimate > 1.0 and b["before_attack_seconds"] >= 1700.0
    assert b["attack_budget_seconds"] == pytest.approx(min(360.0, max(left, 180.0)), abs=0.2)
    assert b["attack_budget_seconds"] < 360.0  # what came before was taken from the attack
    assert b["covered"] == (left >= 180.0)


def test_the_demo_budget_is_covered_where_the_attack_takes_exactly_what_is_left(victim_dir, monkeypatch):
    """1,721.029 s spent of 2,000 and a 5.178-s evaluation leave 273.793 s: the attack takes exactly that, so the budget
    is covered (a sum ``before + attack + estimate`` rounds to 2,000.0000000000002 here and would say it is not)."""
    import exhume.evaluation.cost as cost
    from exhume.deadline import Deadline
    from exhume.demo import _attack_budget

    monkeypatch.setattr(cost, "evaluation_estimate", lambda *a, **k: {"total": 5.178})
    monkeypatch.setattr(Deadline, "spent", lambda self: 1721.029)
    b = _attack_budget(exhume.load_victim(victim_dir), 360.0, Deadline.after(2000.0))
    assert b["attack_budget_seconds"] == pytest.approx(273.8, abs=0.05) and b["covered"] is True
