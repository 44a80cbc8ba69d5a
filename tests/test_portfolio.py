"""The restart portfolio: pooling and merging, provenance through save/load, resume mid-portfolio,
reproducibility, starved restarts, parallel workers with a user's own module, shared studies
(SQLite always, PostgreSQL when EXHUME_TEST_POSTGRES is set), and the CLI round trip."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from _extras import need
from _postgres import postgres_dsn
from torch import nn

import exhume
from exhume.attacks import Reconstruction, RunRecord, get_attack, load_reconstruction
from exhume.cli import main
from exhume.evaluation.matching import ncc_matrix
from exhume.evaluation.ssim import ssim_pairs
from exhume.portfolio import make_plan, pool, run_portfolio, starved
from exhume.portfolio.pool import restart_record
from exhume.portfolio.report import summary_lines
from exhume.victim import AttackerView

ROOT = Path(__file__).resolve().parents[1]
FAST = {"iterations": 40, "lr": 0.5, "checkpoint_every": 10}


pytestmark = pytest.mark.usefixtures("one_thread")  # one torch thread, like each forked worker (conftest.py)


# -- pooling on hand-made candidates -------------------------------------------------------------

class TwoLayer(nn.Module):
    """A user's own module (no exhume builder): used by the hand-made and the parallel tests."""

    def __init__(self, d: int = 64, h: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, h, bias=False)
        self.b = nn.Linear(h, 1, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.flatten(1)))).squeeze(-1)


def _view(seed: int = 0) -> AttackerView:
    torch.manual_seed(seed)
    return AttackerView(model=TwoLayer(), task="binary", input_shape=(1, 8, 8), mean=torch.full((1, 8, 8), 0.3),
                        loss="logistic", weight_decay=1e-2, n_train_hint=4)


def _recon(images, labels, residual: float, init: str = "noise") -> Reconstruction:
    return Reconstruction(method="kkt", candidates=images, labels=torch.tensor(labels, dtype=torch.float32),
                          scores=torch.full((len(labels),), 0.5), seed=0, record=RunRecord(
                              iterations=100, seconds=1.0, final_relative_stationarity=residual, threat_model="weights only",
                              init=init, settings={"m": len(labels), "alpha": 19.0}))


def test_pool_merges_near_duplicates_keeps_provenance_and_round_trips(tmp_path):
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.rand(1, 1, 8, 8, generator=g) for _ in range(3))
    near_a = (a + 0.01 * torch.randn(1, 1, 8, 8, generator=g)).clamp(0, 1)
    r0 = _recon(torch.cat([a, b]), [1, -1], residual=0.2)
    r1 = _recon(torch.cat([near_a, near_a, c]), [1, -1, 1], residual=0.6, init="partition")  # the 2nd copy has the other label: kept
    plan = make_plan("kkt", 2, seed=5, variants=[{}, {"alpha": 10.0}], attack_kwargs={"iterations": 100})
    rows = {k: restart_record(plan.restarts[k], r, "complete") for k, r in enumerate((r0, r1))}
    out = pool(_view(), plan, {0: r0, 1: r1}, rows)
    assert out.summary["candidates_before_merge"] == 5 and out.candidates.shape[0] == 4
    p = out.provenance
    assert torch.all(p["rank"][:-1] >= p["rank"][1:]), "sorted best-first by the attacker-side rank"
    merged = torch.nonzero(p["merged"] == 1).flatten().tolist()
    assert len(merged) == 1
    i = merged[0]
    assert p["members"][i].tolist() == [True, True] and out.labels[i] == 1
    from exhume.portfolio.pool import rank_scores

    view = _view()
    first_rank = {0: rank_scores(view, r0)[0], 1: rank_scores(view, r1)[0]}  # a and its near-copy are both candidate 0
    kept = p["restart"][i].item()
    assert p["index"][i] == 0 and first_rank[kept] >= first_rank[1 - kept], "the better-ranked copy is kept"
    assert sorted(zip(p["restart"].tolist(), p["index"].tolist())) == sorted([(kept, 0), (0, 1), (1, 1), (1, 2)])
    assert out.seed == 5 and out.config["alpha"] == 19.0 and out.record.settings == {"alpha": 19.0}
    # what the restarts state alike the pooled record states; what differs (the inits here) it leaves out, and names
    assert out.record.threat_model == "weights only" and out.record.init is None and not out.record.oracle_init
    assert out.config["portfolio"]["varied_settings"] == ["init", "m", "oracle_init"] and out.config["portfolio"]["merge_threshold"] == 0.95
    assert (out.record.iterations, out.record.best_residual, out.record.portfolio.restarts_complete) == (200, (0.2, 2), 2)
    out.save(tmp_path / "pooled")
    back = load_reconstruction(tmp_path / "pooled")
    assert set(back.provenance) == {"restart", "index", "iteration", "merged", "members", "rank"}
    for k, v in out.provenance.items():
        assert torch.equal(back.provenance[k], v), k
    assert back.config["portfolio"] == json.loads(json.dumps(out.config["portfolio"])) and back.record == out.record


def test_candidates_still_near_the_mean_are_not_merged_copies_of_an_image_are():
    from exhume.portfolio.pool import near_duplicates

    g = torch.Generator().manual_seed(1)
    mean = torch.rand(1, 8, 8, generator=g) * 0.5
    digit = (mean + 0.4 * torch.rand(1, 8, 8, generator=g)).clamp(0, 1)
    near_mean = mean + 0.01 * torch.randn(6, 1, 8, 8, generator=g)  # under-converged: the mean plus a little noise
    copies = digit + 0.01 * torch.randn(3, 1, 8, 8, generator=g)
    cands, labels = torch.cat([near_mean, copies]), torch.ones(9)
    kept, owner = near_duplicates(cands, labels, torch.arange(9), mean=mean)
    assert kept.tolist() == [0, 1, 2, 3, 4, 5, 6] and owner[7:].tolist() == [6, 6]
    kept_raw, _ = near_duplicates(cands, labels, torch.arange(9))  # without the mean taken out, they all look alike
    assert len(kept_raw) < 7


def test_images_that_correlate_but_differ_in_local_structure_are_not_merged():
    """A copy with a fine texture on it correlates with the original above 0.95 but its SSIM is below
    0.98: both stay (the evaluator's SSIM can tell them apart); a copy with faint noise is merged;
    without the SSIM check (or for inputs that are not images) the correlation alone decides."""
    from exhume.portfolio.pool import DUPLICATE_NCC, DUPLICATE_SSIM, near_duplicates

    yy, xx = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    blob = torch.exp(-((yy - 14) ** 2 + (xx - 14) ** 2) / 40.0)[None, None]
    textured = (blob + 0.04 * ((yy + xx) % 2 * 2 - 1)).clamp(0, 1)
    faint = (blob + 0.005 * torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    mean = torch.zeros(1, 28, 28)
    assert float(ncc_matrix(blob, textured)) > DUPLICATE_NCC and float(ssim_pairs(blob, textured)) < DUPLICATE_SSIM
    cands, labels, order = torch.cat([blob, textured, faint]), torch.ones(3), torch.arange(3)
    kept, owner = near_duplicates(cands, labels, order, mean=mean)
    assert kept.tolist() == [0, 1] and owner.tolist() == [0, 1, 0]
    kept_ncc, _ = near_duplicates(cands, labels, order, mean=mean, ssim_threshold=None)
    assert kept_ncc.tolist() == [0]
    kept_flat, _ = near_duplicates(cands.reshape(3, -1), labels, order, mean=mean.reshape(-1))
    assert kept_flat.tolist() == [0], "vectors: the correlation alone"


def test_a_portfolio_on_vector_inputs_pools():
    """Tabular victims (inputs that are not images): the restarts' candidates merge by correlation alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16, bias=False), nn.ReLU(), nn.Linear(16, 1, bias=False), nn.Flatten(0))
    view = AttackerView(model=model, task="binary", input_shape=(5,), mean=torch.zeros(5), loss="logistic",
                        weight_decay=1e-2, n_train_hint=6)
    out = run_portfolio(view, restarts=2, workers=1, progress=False, iterations=20)
    assert out.summary["candidates_before_merge"] == 24 and 1 <= out.candidates.shape[0] <= 24
    assert out.candidates.shape[1:] == (5,) and out.provenance["members"].shape == (out.candidates.shape[0], 2)


def test_starved_rule():
    assert starved({0: 1000, 1: 900, 2: 300}) == [2]
    assert starved({0: 1000, 1: 600}) == [] and starved({0: 5}) == []


def test_default_kkt_restarts_alternate_the_multipliers_pace_unless_the_caller_set_it():
    plan = make_plan("kkt", 4, seed=3, max_seconds=80.0, workers=2, attack_kwargs={"alpha": 10.0})
    assert [r.seed for r in plan.restarts] == [3, 4, 5, 6]
    assert [r.kwargs.get("lr_lambda") for r in plan.restarts] == [None, 1e-2, None, 1e-2]
    assert [r.overrides for r in plan.restarts] == [{}, {"lr_lambda": 1e-2}, {}, {"lr_lambda": 1e-2}]
    assert all(r.kwargs["alpha"] == 10.0 and r.seconds == 40.0 and "max_seconds" not in r.kwargs for r in plan.restarts)
    # a value the caller set is kept on every restart; an explicit variant list still overrides it
    mine = make_plan("kkt", 4, attack_kwargs={"lr_lambda": 3e-3})
    assert [r.kwargs["lr_lambda"] for r in mine.restarts] == [3e-3] * 4 and all(r.overrides == {} for r in mine.restarts)
    given = make_plan("kkt", 2, variants=[{}, {"lr_lambda": 1e-3}], attack_kwargs={"lr_lambda": 3e-3})
    assert [r.kwargs["lr_lambda"] for r in given.restarts] == [3e-3, 1e-3]


# -- real restarts on a tiny victim --------------------------------------------------------------

def test_resume_mid_portfolio_runs_only_the_rest_and_matches_an_uninterrupted_run(victim_dir, tmp_path, monkeypatch):
    victim = exhume.load_victim(victim_dir)
    whole = run_portfolio(victim, restarts=3, workers=1, out=tmp_path / "whole", progress=False, **FAST)
    again = run_portfolio(victim, restarts=3, workers=1, progress=False, **FAST)
    assert torch.equal(whole.candidates, again.candidates), "same seed and iteration counts, same pooled candidates"
    assert whole.summary["iterations_per_restart"] == [40, 40, 40]

    import exhume.portfolio.runner as runner

    real = runner.run_restart
    calls: list[tuple[int, bool]] = []

    def interrupted(view, method, restart, folder, resume, device, progress, *deadlines):
        calls.append((restart.index, resume))
        if restart.index == 2:  # restart 2 gets 20 of its 40 iterations, then the user presses Ctrl-C

            def ctrl_c(*args, **kwargs):
                raise KeyboardInterrupt

            get_attack(method, **restart.kwargs).run(view, out=folder, seed=restart.seed, progress=False,
                                                    callback=ctrl_c, callback_every=20)
        return real(view, method, restart, folder, resume, device, progress, *deadlines)

    monkeypatch.setattr(runner, "run_restart", interrupted)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_portfolio(victim, restarts=3, workers=1, out=out, progress=False, **FAST)
    assert (out / "restarts" / "1" / "restart.json").is_file() and not (out / "restarts" / "2" / "restart.json").exists()
    assert (out / "restarts" / "2" / "checkpoint.pt").is_file()
    calls.clear()
    monkeypatch.setattr(runner, "run_restart", lambda *a: calls.append((a[2].index, a[4])) or real(*a))
    resumed = run_portfolio(victim, restarts=3, workers=1, out=out, resume=True, progress=False, **FAST)
    assert calls == [(2, True)], "only the unfinished restart ran, from its checkpoint"
    assert torch.equal(resumed.candidates, whole.candidates)
    for k, v in whole.provenance.items():
        assert torch.equal(resumed.provenance[k], v), k
    assert [r.get("reused", False) for r in resumed.config["portfolio"]["restarts"]] == [True, True, False]
    assert torch.equal(load_reconstruction(out).candidates, whole.candidates)


def test_starved_restart_is_flagged(victim_dir):
    victim = exhume.load_victim(victim_dir)
    r = run_portfolio(victim, restarts=3, workers=1, progress=False, variants=[{}, {}, {"iterations": 1}],
                      **{**FAST, "iterations": 20})
    assert r.summary["iterations_per_restart"] == [20, 20, 1]
    assert r.summary["starved_restarts"] == [2]
    lines = summary_lines(r.summary, r.config["portfolio"])
    assert any(line.startswith("warning: restart 2 ran 1 iterations") for line in lines)
    assert "iterations" in r.config["portfolio"]["varied_settings"]


def test_parallel_workers_take_a_users_module(monkeypatch):
    view = _view(1)
    kw = {"iterations": 30, "m": 6, "lr": 0.05}
    one = run_portfolio(view, restarts=2, workers=1, progress=False, **kw)
    forked = run_portfolio(view, restarts=2, workers=2, progress=False, **kw)
    assert torch.equal(one.candidates, forked.candidates)


@pytest.mark.slow
def test_spawned_workers_take_a_users_module(monkeypatch):
    import exhume.portfolio.runner as runner

    view = _view(1)
    kw = {"iterations": 30, "m": 6, "lr": 0.05}
    one = run_portfolio(view, restarts=2, workers=1, progress=False, **kw)

    monkeypatch.setattr(runner, "start_method", lambda device: "spawn")  # a fresh interpreter imports this test module
    spawned = run_portfolio(view, restarts=2, workers=2, progress=False, **kw)  # (the path for GPUs and macOS)
    assert torch.allclose(one.candidates, spawned.candidates, atol=1e-4)  # spawned workers may run more threads
    assert spawned.provenance["members"].any(0).tolist() == [True, True]  # both restarts ran and were pooled


def test_restarts_one_is_exactly_one_run(victim_dir, tmp_path):
    victim = exhume.load_victim(victim_dir)
    single = exhume.attack(victim, "kkt", seed=3, restarts=1, progress=False, iterations=40)
    direct = get_attack("kkt", iterations=40).run(victim.attacker_view(), seed=3, progress=False)
    assert torch.equal(single.candidates, direct.candidates) and single.provenance == {}
    assert "portfolio" not in single.config
    pooled = exhume.attack(victim, "kkt", seed=3, restarts=2, workers=1, progress=False, iterations=40)
    assert pooled.config["portfolio"]["restarts"][0]["seed"] == 3 and pooled.summary["restarts"] == 2
    with pytest.raises(exhume.ExhumeError, match="restarts=1"):
        exhume.attack(victim, "kkt", init="noise", restarts=2, progress=False)


def test_cli_round_trip(victim_dir, tmp_path, capsys):
    a = tmp_path / "attack"
    assert main(["attack", str(victim_dir), "-o", str(a), "--restarts", "2", "--workers", "1", "--iterations", "30",
                 "-p", "lr=0.5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "pooled" in out and "restart  seed  variant" in out
    assert (a / "restarts" / "1" / "reconstruction.safetensors").is_file()
    assert main(["evaluate", str(a), "--against", str(victim_dir), "--pool-size", "50"]) == 0
    assert "memorised per restart" in capsys.readouterr().out
    metrics = json.loads((a / "evaluation" / "metrics.json").read_text())
    assert len(metrics["memorised_per_restart"]) == 2
    assert sum(metrics["memorised_found_by"].values()) == metrics["memorised"], "every memorised image is found by >= 1 restart"
    assert main(["report", str(a)]) == 0
    page = (a / "report.html").read_text()
    assert 'id="restarts"' in page and 'id="found-by"' in page
    assert main(["attack", str(victim_dir), "-o", str(a), "--restarts", "0"]) == 2
    assert "--restarts expects a positive integer" in capsys.readouterr().err
    assert main(["attack", str(victim_dir), "-o", str(a), "--worker"]) == 2
    assert "--worker needs --storage" in capsys.readouterr().err


def test_portfolio_folder_is_owned_like_a_single_run(victim_dir, tmp_path):
    """A portfolio's run folder: no silent overwrite, --resume needs its restarts, --force replaces, a live lock refuses."""
    victim = exhume.load_victim(victim_dir)
    out = tmp_path / "pf"
    kw = dict(restarts=2, workers=1, progress=False, iterations=20)
    with pytest.raises(exhume.ExhumeError, match="cannot resume"):
        exhume.attack(victim, "kkt", out=out, resume=True, **kw)
    first = exhume.attack(victim, "kkt", out=out, **kw)
    with pytest.raises(exhume.ExhumeError, match="already holds a run"):
        exhume.attack(victim, "kkt", out=out, **kw)
    again = exhume.attack(victim, "kkt", out=out, resume=True, **kw)  # both restarts reused
    assert torch.equal(first.candidates, again.candidates)
    other = victim.attacker_view()
    with torch.no_grad():
        other.model = copy.deepcopy(victim.model)
        next(other.model.parameters()).add_(1e-3)  # other weights: the stored restarts are not theirs
    with pytest.raises(exhume.ExhumeError, match="another victim"):
        exhume.attack(other, "kkt", out=out, resume=True, **kw)
    (out / "restarts" / "1" / "marker").write_text("from the replaced run")
    exhume.attack(victim, "kkt", out=out, force=True, **kw)
    assert not (out / "restarts" / "1" / "marker").exists()
    (out / ".exhume.lock").write_text(str(os.getppid()))  # a live process holds the folder
    with pytest.raises(exhume.ExhumeError, match="in use by another exhume run"):
        exhume.attack(victim, "kkt", out=out, force=True, **kw)


# -- one study, two workers ----------------------------------------------------------------------

_dsn = postgres_dsn


def _attack(victim_dir, out, storage, study, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "exhume", "attack", str(victim_dir), "-o", str(out), "--storage", storage, "--study-name", study,
           "--workers", "1", "--no-progress", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _two_workers_one_study(victim_dir, tmp_path, storage):
    optuna = need("optuna", "tune")
    study = f"test-{uuid.uuid4().hex[:10]}"
    helper = _attack(victim_dir, tmp_path / "helper", storage, study, "--worker")  # waits for the study to appear
    pooler = _attack(victim_dir, tmp_path / "pooled", storage, study, "--restarts", "4", "--max-seconds", "8",
                     "-p", "lr=0.5", "-p", "iterations=100000")
    for p in (pooler, helper):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    recon = load_reconstruction(tmp_path / "pooled")
    assert recon.summary["restarts_complete"] == 4
    assert recon.provenance["members"].any(0).tolist() == [True] * 4  # every restart pooled (some may be merged away)
    from exhume.portfolio.store import ResultTable, engine_url

    s = optuna.load_study(study_name=study, storage=engine_url(storage))
    done = [t for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs["restart"] for t in done) == [0, 1, 2, 3]
    assert {t.user_attrs["pid"] for t in done} == {pooler.pid, helper.pid}, "both workers ran restarts"
    # the results live in the database: any machine pools the same reconstruction from there
    table = ResultTable(storage, study)
    assert sorted(table.load_all()) == [0, 1, 2, 3] and not (tmp_path / "helper" / "restarts" / "0" / "restart.json").exists()
    table.dispose()


def test_two_workers_share_one_sqlite_study(victim_dir, tmp_path):
    _two_workers_one_study(victim_dir, tmp_path, f"sqlite:///{tmp_path / 'study.db'}")


def test_two_workers_share_one_postgres_study(victim_dir, tmp_path):
    _two_workers_one_study(victim_dir, tmp_path, _dsn())


def test_blocked_merge_equals_the_dense_correlation_rule(monkeypatch):
    """The merge computes the correlations over blocks of rows and keeps only the flagged pairs: on
    candidates with planted near-copies (several labels, blocks of 7 rows) it merges exactly what the
    dense ``ncc_matrix`` rule merges."""
    import dataclasses
    import importlib

    pool_mod = importlib.import_module("exhume.portfolio.pool")

    g = torch.Generator().manual_seed(3)
    base = torch.rand(12, 1, 10, 10, generator=g)
    copies = (base[torch.arange(36) % 12] + 0.03 * torch.randn(36, 1, 10, 10, generator=g)).clamp(0, 1)
    cands = torch.cat([base, copies])[torch.randperm(48, generator=g)]
    labels = torch.randint(0, 2, (48,), generator=g).float()
    order = torch.randperm(48, generator=g)
    mean = torch.full((1, 10, 10), 0.5)

    flat = (cands.clamp(0, 1) - mean).reshape(48, -1)
    dense = (ncc_matrix(flat.reshape(48, 1, 1, -1), flat.reshape(48, 1, 1, -1)) > 0.95) & (labels[:, None] == labels[None, :])
    want = {(a, b) for a, b in torch.nonzero(torch.triu(dense, 1)).tolist()}
    owner_ref = torch.full((48,), -1, dtype=torch.long)  # the greedy rule on the dense matrix
    for a in order.tolist():
        if owner_ref[a] < 0:
            owner_ref[a] = a
            owner_ref[(owner_ref < 0) & dense[a]] = a

    monkeypatch.setattr(pool_mod, "LIMITS", dataclasses.replace(pool_mod.LIMITS, candidates_x_pool_block=7 * 48))  # 7 rows
    assert len(want) >= 20  # the planted near-copies make many pairs
    kept, owner = pool_mod.near_duplicates(cands, labels, order, mean=mean, ssim_threshold=None)
    assert torch.equal(owner, owner_ref) and kept.tolist() == [a for a in order.tolist() if owner_ref[a] == a]


def test_a_trial_another_worker_told_first_is_not_an_error_and_other_errors_are(monkeypatch):
    """SQLite does not lock a claimed trial, so two workers can run the same waiting restart (same seed: the same
    result); the one that tells it second goes on. Any other error of a trial still stops the worker."""
    optuna = need("optuna", "tune")

    from exhume.studies import work

    class Study:
        def __init__(self, error):
            self.error, self.runs = error, 0

        def optimize(self, objective, n_trials, catch):
            self.runs += 1
            if self.runs == 1:
                raise self.error

    monkeypatch.setattr(optuna.storages, "fail_stale_trials", lambda study: None)
    told = Study(ValueError("Cannot tell a COMPLETE trial."))
    work(told, None, lambda: "run" if told.runs < 2 else "done")
    assert told.runs == 2
    other = Study(ValueError("a real failure"))
    with pytest.raises(ValueError, match="a real failure"):
        work(other, None, lambda: "run")
