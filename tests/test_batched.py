"""The batched restarts (exhume/portfolio/batched/): the same candidates as the restarts run one by one at equal
iterations (float64) for every kkt setting that enters the step, a divergent restart leaving the batch alone, resume
from a batched checkpoint, the choice of path ('auto' batches on a CUDA device string, without needing CUDA) and the
CLI's --batch-restarts."""

from __future__ import annotations

import pytest
import torch

import exhume
from exhume.cli import main
from exhume.errors import ConfigError
from exhume.portfolio import make_plan, run_portfolio
from exhume.portfolio.batched import batch_key, groups, use_batched

pytestmark = pytest.mark.usefixtures("one_thread")

# float64 and snapshots inside the run (every 20 iterations, snapshots): the averaged iterates and the kept snapshot are
# compared too
EXACT = {"iterations": 60, "dtype": "float64", "checkpoint_every": 25, "lr": 0.05}


@pytest.fixture
def snapshots(monkeypatch):
    """kkt takes a snapshot every 20 iterations (its constant is 500), and the lone runs stay eager."""
    monkeypatch.setattr("exhume.attacks.kkt.settings.SNAPSHOT_EVERY", 20)
    monkeypatch.setattr("exhume.attacks.kkt.settings.traces", lambda iterations, seconds: False)


def _restarts(out, count: int):
    return [exhume.load_reconstruction(out / "restarts" / str(k)) for k in range(count)]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_batched_restarts_equal_the_restarts_run_one_by_one(victim_dir, tmp_path, monkeypatch, snapshots, traced):
    import exhume.portfolio.batched.engine as batched_mod

    # the batch replays its traced graph from the first step or never
    monkeypatch.setattr(batched_mod, "traces", lambda iterations, seconds: traced)
    victim = exhume.load_victim(victim_dir)
    one = run_portfolio(victim, restarts=3, workers=1, out=tmp_path / "one", progress=False, batch_restarts="off", **EXACT)
    batched = run_portfolio(victim, restarts=3, workers=1, out=tmp_path / "batched", progress=False, batch_restarts="on", **EXACT)
    assert batched.config["portfolio"]["batched"]["used"] and not one.config["portfolio"]["batched"]["used"]
    assert batched.config["portfolio"]["batched"]["groups"][0] == {"restarts": [0, 1, 2], "batched": True, "seconds_given": None,
                                                                  "tf32": False}
    for a, b in zip(_restarts(tmp_path / "one", 3), _restarts(tmp_path / "batched", 3), strict=True):
        assert a.summary["iterations"] == b.summary["iterations"] == 60
        assert a.summary["kept_iteration"] == b.summary["kept_iteration"]
        assert a.config["lr_lambda_used"] == b.config["lr_lambda_used"]  # the variants alternate inside the batch
        assert torch.allclose(a.candidates, b.candidates, rtol=0, atol=1e-6)  # float32 on output, float64 inside
        assert torch.allclose(a.scores, b.scores, rtol=1e-6, atol=1e-9)
        assert a.summary["final_relative_stationarity"] == pytest.approx(b.summary["final_relative_stationarity"], rel=1e-9)
        assert [h["stationarity"] for h in a.loss_history] == pytest.approx([h["stationarity"] for h in b.loss_history], rel=1e-9)
        # and they moved: 60 steps took the residual far below the first step's (a step that did nothing would tie)
        assert b.summary["final_relative_stationarity"] < 0.5 * b.loss_history[0]["stationarity"]
    assert b.config["batched_restarts"] == 3 and b.config["residual_traced"] is traced
    assert torch.allclose(one.candidates, batched.candidates, atol=1e-6)  # the same pooled result


def test_restarts_that_differ_in_more_than_their_rates_run_in_separate_batches(victim_dir, tmp_path):
    victim = exhume.load_victim(victim_dir)
    variants = [{}, {"lr_lambda": 1e-2}, {"alpha": 10.0}]
    plan = make_plan("kkt", 3, workers=1, variants=variants, attack_kwargs={"iterations": 10})
    assert [[r.index for r in g] for g in groups(list(plan.restarts))] == [[0, 1], [2]]
    assert batch_key(plan.restarts[0]) == batch_key(plan.restarts[1]) != batch_key(plan.restarts[2])
    assert [[r.index for r in g] for g in groups(list(plan.restarts), capacity=1)] == [[0], [1], [2]]  # memory for one at a time
    r = run_portfolio(victim, restarts=3, workers=1, progress=False, batch_restarts="on", variants=variants, iterations=10)
    assert [g["restarts"] for g in r.config["portfolio"]["batched"]["groups"]] == [[0, 1], [2]]
    assert all(row["iterations"] == 10 for row in r.config["portfolio"]["restarts"])


def test_a_divergent_restart_leaves_the_batch_and_the_others_are_unchanged(victim_dir):
    victim = exhume.load_victim(victim_dir)
    kw = dict(restarts=2, workers=1, progress=False, iterations=30, dtype="float64")
    variants = [{"lr": 0.05}, {"lr": 1e200}]  # the second blows up at once
    ref = run_portfolio(victim, batch_restarts="off", variants=variants, **kw)
    got = run_portfolio(victim, batch_restarts="on", variants=variants, **kw)
    assert ref.config["portfolio"]["restarts"][1]["status"] == "diverged"
    rows = {row["restart"]: row for row in got.config["portfolio"]["restarts"]}
    assert rows[1]["status"] == "diverged" and "diverged at iteration" in rows[1]["error"]
    assert rows[0]["status"] == "complete" and rows[0]["iterations"] == 30
    assert torch.allclose(ref.candidates, got.candidates, atol=1e-6)


def test_an_interrupted_batch_resumes_to_the_uninterrupted_result(victim_dir, tmp_path):
    victim = exhume.load_victim(victim_dir)
    kw = dict(restarts=2, workers=1, progress=False, batch_restarts="on", dtype="float64", checkpoint_every=20, lr=0.05)
    whole = run_portfolio(victim, out=tmp_path / "whole", iterations=40, **kw)
    run_portfolio(victim, out=tmp_path / "cut", iterations=20, **kw)
    for k in range(2):  # what a run stopped at iteration 20 of 40 leaves: its checkpoint, no finished restart
        (tmp_path / "cut" / "restarts" / str(k) / "reconstruction.json").unlink()
    resumed = run_portfolio(victim, out=tmp_path / "cut", iterations=40, resume=True, **{**kw, "checkpoint_every": 20})
    assert [row["iterations"] for row in resumed.config["portfolio"]["restarts"]] == [40, 40]
    assert torch.allclose(whole.candidates, resumed.candidates, atol=1e-6)


def test_tf32_is_off_inside_a_batch_and_restored_after():
    from exhume.portfolio.batched import no_tf32

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with no_tf32():
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_auto_batches_on_a_cuda_device_and_nowhere_else():
    assert use_batched("auto", "cuda", "kkt", None)[0]
    assert use_batched("auto", "cuda:1", "kkt", None)[0]
    assert not use_batched("auto", "cpu", "kkt", None)[0]
    assert not use_batched("auto", "cuda", "bilevel", None)[0]  # no batched path: worker processes
    assert not use_batched("auto", "cuda", "kkt", "sqlite:///s.db")[0]  # a shared study: one restart per process
    assert use_batched("on", "cpu", "kkt", None)[0] and not use_batched("off", "cuda", "kkt", None)[0]
    with pytest.raises(ConfigError, match="batch_restarts='on' cannot apply: a shared study"):
        use_batched("on", "cuda", "kkt", "sqlite:///s.db")
    with pytest.raises(ConfigError, match="batch_restarts must be one of auto, on, off"):
        use_batched("yes", "cuda", "kkt", None)


def test_the_cli_passes_batch_restarts(victim_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["attack", str(victim_dir), "--out", str(out), "--restarts", "2", "--workers", "1", "--batch-restarts", "on",
                 "--iterations", "10", "--no-progress"]) == 0
    assert "restarts batched in one process (exhume/portfolio/batched/): asked for" in capsys.readouterr().out
    got = exhume.load_reconstruction(out)
    assert got.config["portfolio"]["batched"]["used"] and got.config["portfolio"]["batched"]["why"].startswith("asked for")
    assert main(["attack", str(victim_dir), "--out", str(tmp_path / "cpu"), "--restarts", "2", "--workers", "1",
                 "--iterations", "10", "--no-progress"]) == 0
    assert exhume.load_reconstruction(tmp_path / "cpu").config["portfolio"]["batched"] == {
        "used": False, "why": "auto: on CPU, one forked worker per core"}
    with pytest.raises(SystemExit):
        main(["attack", str(victim_dir), "--out", str(tmp_path / "x"), "--batch-restarts", "maybe", "--no-progress"])


class _Branchy(torch.nn.Module):
    """A user's module with control flow on a tensor's value: vmap cannot run it, a lone run can."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 8, bias=False)
        self.b = torch.nn.Linear(8, 1, bias=False)

    def forward(self, x):
        h = torch.relu(self.a(x.flatten(1)))
        if h.sum() > 1e9:  # never true; data-dependent all the same
            h = h * 0
        return self.b(h).squeeze(-1)


def test_a_module_vmap_cannot_run_falls_back_to_one_restart_after_another():
    from exhume.victim import AttackerView

    torch.manual_seed(0)
    view = AttackerView(model=_Branchy(), task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.3),
                        loss="logistic", weight_decay=1e-2, n_train_hint=4)
    r = run_portfolio(view, restarts=2, workers=1, progress=False, batch_restarts="on", iterations=5)
    group = r.config["portfolio"]["batched"]["groups"][0]
    assert group["batched"] is False and "torch.func.vmap cannot run this module" in group["reason"]
    assert [row["iterations"] for row in r.config["portfolio"]["restarts"]] == [5, 5]


def test_exhume_attack_device_cuda_takes_the_batched_path(victim_dir, tmp_path, monkeypatch):
    """The wiring from the command line to the batched path, on a machine without CUDA: the device check and the memory
    check are passed over and the run stops where the restarts would start, recording which path it was given."""
    import exhume.device
    import exhume.portfolio.run as run_mod

    class Reached(Exception):
        pass

    seen = {}

    def stop(view, plan, out, resume, device, progress, batches=None, deadline=None):
        seen.update(device=device, batched=batches is not None, restarts=len(plan.restarts))
        raise Reached

    monkeypatch.setattr(exhume.device, "check_device", lambda device: device)  # the request's budget checks it there
    monkeypatch.setattr(run_mod, "check_portfolio_memory", lambda *a, **k: None)
    monkeypatch.setattr(run_mod, "run_local", stop)
    for flag, batched in (([], True), (["--batch-restarts", "off"], False)):
        with pytest.raises(Reached):
            main(["attack", str(victim_dir), "--out", str(tmp_path / f"run{batched}"), "--device", "cuda", "--restarts", "3",
                  "--iterations", "10", "--no-progress", *flag])
        assert seen == {"device": "cuda", "batched": batched, "restarts": 3}


def test_a_cnn_batched_equals_its_restarts_one_by_one(snapshots):
    """A 28×28 CNN whose activations take the surrogate ReLU's one-node path under vmap (more than 2^16 elements)."""
    from exhume.models.builders import build_model
    from exhume.victim import AttackerView

    torch.manual_seed(0)
    view = AttackerView(model=build_model("cnn:4;fc=16;pool=avg", (1, 28, 28), 1), task="binary", input_shape=(1, 28, 28),
                        mean=torch.full((1, 28, 28), 0.13), loss="logistic", weight_decay=5e-3, n_train_hint=12)
    kw = dict(restarts=2, workers=1, progress=False, iterations=20, dtype="float64", lr=0.05)
    one, batched = (run_portfolio(view, batch_restarts=b, **kw) for b in ("off", "on"))
    assert batched.config["portfolio"]["batched"]["groups"][0]["batched"]
    assert one.candidates.shape == batched.candidates.shape and torch.allclose(one.candidates, batched.candidates, atol=1e-6)
    assert [r["final_relative_stationarity"] for r in one.config["portfolio"]["restarts"]] == pytest.approx(
        [r["final_relative_stationarity"] for r in batched.config["portfolio"]["restarts"]], rel=1e-9)


def _view(kind: str, victim_dir):
    """The victim of a case: the MNIST victim of the suite, or a small random network (binary, 3-class, regression), or
    a fine-tuned one with its start known."""
    from _start_cases import fine_tuned

    from exhume.models.builders import build_model
    from exhume.victim import AttackerView

    if kind == "mnist":
        return exhume.load_victim(victim_dir).attacker_view(), {}
    if kind == "start":
        model, start, _ = fine_tuned()
        return AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5), loss="logistic",
                            weight_decay=1e-3, n_train_hint=4), {"start": start}
    torch.manual_seed(0)
    task, classes, loss = {"binary": ("binary", 1, "logistic"), "multiclass": ("multiclass", 3, "cross-entropy"),
                           "regression": ("regression", 1, "squared")}[kind]
    return AttackerView(model=build_model("mlp:12;bias=none", (1, 6, 6), classes), task=task, input_shape=(1, 6, 6),
                        mean=torch.full((1, 6, 6), 0.3), loss=loss, weight_decay=1e-2, n_train_hint=4,
                        num_classes=classes if task == "multiclass" else None), {}


#: every kkt setting that enters the step, each case on a victim it applies to: (victim, settings, what the run must use)
STEP_CASES = {
    "learned, stationary, span and denoise": ("mnist", {}, {"subspace_used": "above-noise"}),
    "span and denoise off": ("mnist", {"subspace": "off", "denoise": "off"}, {}),
    "closed-form, non-negative": ("binary", {"multipliers": "closed-form"}, {"formulation": "margin"}),
    "closed-form, signed": ("regression", {"multipliers": "closed-form"}, {"formulation": "output"}),
    "centred prior, tv": ("binary", {"prior": "centred", "tv_weight": 1e-3}, {}),
    "soft margin": ("multiclass", {}, {"formulation": "soft-margin"}),
    "runner-up margin": ("multiclass", {"formulation": "margin"}, {}),
    "loss": ("binary", {"formulation": "loss"}, {}),
    "output": ("regression", {}, {"formulation": "output"}),
    "sgd, the iterate itself": ("binary", {"optimizer": "sgd", "lr": 1e-3, "average_decay": 0.0}, {}),
    "trajectory": ("mnist", {"start_equation": "trajectory"}, {"equation_used": "trajectory"}),
    "endpoints": ("start", {}, {"equation_used": "endpoints"}),
    "endpoints, closed-form": ("start", {"multipliers": "closed-form"}, {"equation_used": "endpoints"}),
    "haim2022 preset": ("binary", {"preset": "haim2022", "lr": 0.02}, {"prior": "centred"}),
}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_every_setting_of_the_step_batched_equals_its_restarts_one_by_one(case, victim_dir, tmp_path, snapshots):
    """Batched (one vmapped evaluation, then each restart's own kkt Step.advance) = lone, restart by restart, in float64:
    candidates, multipliers, kept snapshot, loss history and final stationarity."""
    kind, settings, used = STEP_CASES[case]
    view, extra = _view(kind, victim_dir)
    kw = dict(restarts=2, workers=1, progress=False, iterations=45, dtype="float64", log_every=5, **extra, **settings)
    one = run_portfolio(view, out=tmp_path / "one", batch_restarts="off", **kw)
    batched = run_portfolio(view, out=tmp_path / "batched", batch_restarts="on", **kw)
    assert batched.config["portfolio"]["batched"]["groups"][0]["batched"], batched.config["portfolio"]["batched"]
    assert {k: batched.config.get(k) for k in used} == used
    for a, b in zip(_restarts(tmp_path / "one", 2), _restarts(tmp_path / "batched", 2), strict=True):
        assert a.summary["iterations"] == b.summary["iterations"] == 45 and a.summary["kept_iteration"] == b.summary["kept_iteration"]
        assert torch.allclose(a.candidates, b.candidates, rtol=0, atol=1e-6)  # float32 on output, float64 inside
        assert torch.allclose(a.scores, b.scores, rtol=1e-6, atol=1e-9)
        assert a.summary["final_relative_stationarity"] == pytest.approx(b.summary["final_relative_stationarity"], rel=1e-8)
        assert [h["loss"] for h in a.loss_history] == pytest.approx([h["loss"] for h in b.loss_history], rel=1e-8)
    assert torch.allclose(one.candidates, batched.candidates, atol=1e-6)  # the same pooled result
