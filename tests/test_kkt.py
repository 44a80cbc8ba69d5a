"""The stationarity attack: torch.func path against a plain autograd reference, the surrogate
ReLU, recovery on Haim's 2D toy, any nn.Module, resume (checkpoints of settings kkt no longer has
included), parameter validation and presets."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.kkt import PRESETS, KKTAttack
from exhume.deadline import Deadline
from exhume.equations.formulation import NO_DECAY_MARGIN, typical_margin
from exhume.equations.stationarity import homogeneity_degree, stationarity_residual, stationarity_residual_and_objective
from exhume.equations.surrogate import soft_activations, soft_relu
from exhume.errors import ConfigError, ExhumeError
from exhume.victim import AttackerView


class UserNet(nn.Module):
    """A module exhume did not build: functional ReLU in forward, a bias, an in-place ReLU."""

    def __init__(self, d: int = 5, h: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, h)
        self.b = nn.Linear(h, h, bias=False)
        self.act = nn.ReLU(inplace=True)
        self.c = nn.Linear(h, 1, bias=False)

    def forward(self, x):
        z = F.relu(self.a(x.flatten(1)))
        z = self.act(self.b(z))
        return self.c(z).squeeze(-1)


def reference_residual(model: nn.Module, x, y, lam, alpha):
    """Plain autograd: swap ReLU for the soft ReLU by hand, then autograd.grad(create_graph=True)."""

    def soft(z):
        return soft_relu(z, alpha) if alpha is not None else torch.relu(z)

    h = soft(model.a(x.flatten(1)))
    h = soft(model.b(h))
    out = model.c(h).squeeze(-1)
    params = list(model.parameters())
    grads = torch.autograd.grad((lam * y * out).sum(), params, create_graph=True)
    return sum(((p.detach() - g) ** 2).sum() for p, g in zip(params, grads))


@pytest.mark.parametrize("alpha", [None, 7.0])
def test_torch_func_path_matches_autograd_reference(alpha):
    torch.manual_seed(0)
    model = UserNet().double()
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    lam = torch.rand(6, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, -1, 1, -1, 1, -1], dtype=torch.float64)
    params = {k: v.detach() for k, v in model.named_parameters()}
    ours = stationarity_residual(model, params, x, y, lam, alpha)
    gx, gl = torch.autograd.grad(ours, (x, lam))
    ref = reference_residual(model, x, y, lam, alpha)
    rx, rl = torch.autograd.grad(ref, (x, lam))
    assert torch.allclose(ours, ref, rtol=1e-10)
    assert torch.allclose(gx, rx, rtol=1e-8, atol=1e-12)
    assert torch.allclose(gl, rl, rtol=1e-8, atol=1e-12)
    assert gx.abs().sum() > 0


def test_soft_relu_keeps_value_and_uses_sigmoid_derivative():
    z = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    with soft_activations(5.0):
        out = nn.ReLU(inplace=True)(z.clone())
        leaky = F.leaky_relu(z, 0.1)
    assert torch.equal(out.detach(), torch.relu(z.detach()))
    (g,) = torch.autograd.grad(out.sum(), z)
    assert torch.allclose(g, torch.sigmoid(5.0 * z.detach()))
    (gl,) = torch.autograd.grad(leaky.sum(), z)
    assert torch.allclose(leaky.detach(), F.leaky_relu(z.detach(), 0.1))
    assert torch.allclose(gl, 0.1 + 0.9 * torch.sigmoid(5.0 * z.detach()))
    # outside the context ReLU is the ordinary one again
    (g2,) = torch.autograd.grad(torch.relu(z).sum(), z)
    assert set(g2.unique().tolist()) <= {0.0, 1.0}


def test_homogeneity_degree_is_depth_of_bias_free_relu_net():
    from exhume.models import MLP

    model = MLP(10, [20, 20], 1, bias=False)
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert homogeneity_degree(model, params, (10,), torch.float32) == pytest.approx(3.0, rel=1e-4)


def test_typical_margin_solves_its_equation():
    for target in (1e-3, 0.02, 0.2):
        m = typical_margin(target)
        assert m / (1 + torch.exp(torch.tensor(m)).item()) == pytest.approx(target, rel=1e-6)


def _full_batch_gd(model: nn.Module, x, y, lr: float, weight_decay: float, epochs: int) -> None:
    """exhume's ``train_victim`` with ``TrainConfig(lr=lr, weight_decay=weight_decay, max_epochs=epochs)`` (logistic
    loss, full-batch GD on mean ℓ + (w/2)‖θ‖²) without its per-epoch bookkeeping (optimiser object, progress, stop
    checks): the same operations, so the same weights bit for bit (checked at 20,000 epochs), in a fifth less time."""
    from exhume.losses import per_sample_loss

    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(epochs):
        obj = per_sample_loss("logistic", model(x), y).mean() + 0.5 * weight_decay * sum((p**2).sum() for p in params)
        grads = torch.autograd.grad(obj, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-lr)


@functools.cache
def _toy_victim():
    """Haim's 2D toy: 20 points in the unit square, a wide bias-free ReLU net trained to convergence."""
    from exhume.models import MLP

    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 2, generator=g)
    y = torch.where(x[:, 0] + 0.3 * torch.sin(6 * x[:, 1]) > 0.6, 1.0, -1.0)
    mean = x.mean(0)
    torch.manual_seed(0)
    model = MLP(2, [500], 1, bias=False)
    _full_batch_gd(model, x - mean, y, lr=0.5, weight_decay=1e-3, epochs=20_000)
    view = AttackerView(model=model, task="binary", input_shape=(2,), mean=mean, loss="logistic", weight_decay=1e-3, n_train_hint=20)
    with torch.no_grad():
        margins = y * model(x - mean)
    return x, margins, view


def test_2d_toy_recovers_the_points_on_the_margin():
    x, margins, view = _toy_victim()
    # a constant step: with SGD at this small rate the steps are too few for a cosine decay to 0 (the point nearest
    # the boundary: 0.017 away after 1,000 steps as after 3,000; 0.027 and 0.028 at seeds 1 and 2, either way)
    recon = get_attack("kkt", iterations=1000, optimizer="sgd", lr=0.001, init_scale=0.01).run(view, progress=False, seed=0)
    dist = torch.cdist(x, recon.candidates).min(1).values
    on_margin = margins.argsort()[:1]
    # the point nearest the decision boundary is recovered almost exactly; a random candidate set
    # would sit ~0.1 away (20 points in the unit square)
    assert dist[on_margin].max() < 0.03
    assert recon.summary["final_relative_stationarity"] < 0.3


def test_residual_and_margins_from_one_forward_equal_the_separate_computations():
    torch.manual_seed(0)
    model = UserNet().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    y = torch.tensor([1.0, -1, 1, -1, 1, -1], dtype=torch.float64)

    def grads(both: bool):
        x = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        lam = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
        if both:
            r, h = stationarity_residual_and_objective(model, params, x, y, lam, 7.0)
        else:
            r = stationarity_residual(model, params, x, y, lam, 7.0)
            with soft_activations(7.0):
                h = y * model(x)
        (r + (h**2).sum()).backward()
        return r.detach(), h.detach(), x.grad, lam.grad

    ours, ref = grads(True), grads(False)
    with torch.no_grad():  # the margins have their exact value: the surrogate changes derivatives only
        x0 = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        assert torch.allclose(ours[1], y * model(x0), rtol=1e-12)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)


def test_without_weight_decay_the_lambda_scale_is_the_multiplier_at_the_assumed_margin():
    """S = ‖θ‖²/(L·n·q₀) from the weights alone, not the S = 1 that found nothing on the zoo's Haim victims."""
    from exhume.models import MLP

    torch.manual_seed(0)
    model = MLP(2, [64, 64], 1, bias=False)
    view = AttackerView(model=model, task="binary", input_shape=(2,), mean=torch.zeros(2), loss="logistic",
                        weight_decay=0.0, n_train_hint=7)
    recon = get_attack("kkt", iterations=1).run(view, progress=False)
    theta2 = sum(float((p.detach().double() ** 2).sum()) for p in model.parameters())
    assert recon.config["homogeneity_degree"] == pytest.approx(3.0)
    assert recon.config["assumed_margin"] == NO_DECAY_MARGIN
    assert recon.config["lambda_scale_value"] == pytest.approx(theta2 / (3.0 * 7 * NO_DECAY_MARGIN), rel=1e-6)
    # the assumed margin does not move with the weights: S grows as ‖θ‖²
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    scaled = get_attack("kkt", iterations=1).run(view, progress=False)
    assert scaled.config["lambda_scale_value"] == pytest.approx(recon.config["lambda_scale_value"] * 4.0, rel=1e-6)


def test_a_homogeneous_net_leaves_the_multipliers_scale_to_s():
    """(λ/c, c·x̂) solves the equation of a bias-free ReLU net as well as (λ, x̂): the equation does not
    fix the multipliers' scale, S and the pace of u do (on the zoo's mnist-256-haim, with u at Adam's
    1e-2 a 180-s run's memorised count fell from 10 to 3-6; the portfolio alternates u's rate)."""
    from exhume.models import MLP

    torch.manual_seed(0)
    model = MLP(6, [16, 16], 1, bias=False).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 6, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1], dtype=torch.float64)
    lam = torch.rand(5, dtype=torch.float64)
    base = stationarity_residual(model, params, x, y, lam, None)
    assert base > 0
    for c in (0.25, 4.0):
        assert stationarity_residual(model, params, c * x, y, lam / c, None) == pytest.approx(float(base), rel=1e-10)
    # a bias breaks the symmetry (UserNet's first layer has one)
    user = UserNet(6).double()
    uparams = {k: v.detach() for k, v in user.named_parameters()}
    ub = stationarity_residual(user, uparams, x, y, lam, None)
    assert float(stationarity_residual(user, uparams, 4.0 * x, y, lam / 4.0, None)) != pytest.approx(float(ub), rel=1e-3)


def test_attack_runs_on_a_module_exhume_did_not_build():
    torch.manual_seed(0)
    model = UserNet(d=12)
    view = AttackerView(model=model, task="binary", input_shape=(3, 4), mean=torch.zeros(3, 4), n_train_hint=4)
    recon = get_attack("kkt", iterations=60, lr=1e-3).run(view, progress=False, log_every=10)
    assert recon.candidates.shape == (8, 3, 4)
    hist = [h["stationarity"] for h in recon.loss_history]
    assert hist[-1] < hist[0]


def test_resume_continues_exactly_where_the_interrupted_run_stopped(tmp_path, monkeypatch):
    from exhume.attacks.kkt import settings

    monkeypatch.setattr(settings, "SNAPSHOT_EVERY", 20)  # with the averaged snapshot inside the run
    torch.manual_seed(0)
    model = UserNet(d=12)
    view = AttackerView(model=model, task="binary", input_shape=(12,), mean=torch.zeros(12), n_train_hint=4)
    kw = dict(lr=1e-3)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    full = get_attack("kkt", iterations=80, **kw).run(view, progress=False, seed=3, checkpoint_every=20)
    with pytest.raises(KeyboardInterrupt):  # interrupted at 40 (Ctrl-C saves a checkpoint)
        get_attack("kkt", iterations=80, **kw).run(view, out=tmp_path, progress=False, seed=3, callback=ctrl_c, callback_every=40,
                                                   checkpoint_every=20)
    assert (tmp_path / "checkpoint.pt").exists()
    resumed = get_attack("kkt", iterations=80, **kw).run(view, out=tmp_path, resume=True, progress=False, seed=3, checkpoint_every=20)
    assert resumed.summary["iterations"] == 80
    assert torch.allclose(resumed.candidates, full.candidates, atol=1e-6)
    assert torch.allclose(resumed.scores, full.scores, atol=1e-6)
    with pytest.raises(ExhumeError, match="lr"):
        get_attack("kkt", iterations=90, lr=5e-3).run(view, out=tmp_path, resume=True, progress=False, seed=3, checkpoint_every=20)


def test_resume_refuses_a_corrupt_checkpoint(tmp_path):
    model = UserNet(d=12)
    view = AttackerView(model=model, task="binary", input_shape=(12,), mean=torch.zeros(12), n_train_hint=4)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExhumeError, match="checkpoint"):
        get_attack("kkt", iterations=5).run(view, out=tmp_path, resume=True, progress=False)


def test_the_number_of_candidates_follows_candidates_per_point_unless_m_is_given():
    _, _, view = _toy_victim()  # n_train_hint = 20
    for kwargs, m in (({}, 40), ({"candidates_per_point": 1.0}, 20), ({"candidates_per_point": 0.5, "m": 7}, 7)):
        recon = get_attack("kkt", iterations=2, **kwargs).run(view, progress=False, seed=0)
        assert recon.candidates.shape[0] == m and recon.config["m"] == m, kwargs


def test_repr_shows_the_arguments():
    text = repr(get_attack("kkt", lr=0.5, alpha=30))
    assert "lr=0.5" in text and "alpha=30.0" in text and text.startswith("KKTAttack(")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.1}, "no parameter"),
        ({"lr": -1.0}, "lr must be >= 0"),
        ({"lr": "fast"}, "lr must be a number"),
        ({"iterations": 2.5}, "iterations must be an integer"),
        ({"alpha": float("nan")}, "alpha must be finite"),
        ({"prior": "box"}, "prior must be one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"lambda_scale": -2}, "lambda_scale"),
        ({"m": 0}, "m must be >= 1"),
        ({"candidates_per_point": 0.0}, "candidates_per_point must be >= 0.001"),
        ({"tv_weight": -1e-4}, "tv_weight must be >= 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        KKTAttack(**kwargs)


def test_unknown_method_is_refused():
    with pytest.raises(ConfigError, match="unknown attack method 'kkkt'"):
        get_attack("kkkt")


def test_multiclass_victim_without_class_count_is_refused():
    view = AttackerView(model=UserNet(), task="multiclass", input_shape=(5,), mean=torch.zeros(5))
    with pytest.raises(ConfigError, match="num_classes"):
        get_attack("kkt", iterations=1).run(view, progress=False)


def test_shared_loop_checkpoints_on_interrupt_and_excludes_callback_time():
    import time as _time

    from exhume.attacks.engine.loop import run_loop

    saved, history = [], []

    def step(it, log, clock):
        if it == 5:
            raise KeyboardInterrupt
        if log:
            history.append(it)

    with pytest.raises(KeyboardInterrupt):
        run_loop("t", 10, Deadline.never(), 0, 0.0, step, lambda done, el: saved.append(done), log_every=2, checkpoint_every=3,
                 progress=False)
    assert saved == [3, 4] and history == [1, 2, 4]  # the periodic checkpoint, then the last completed step

    end = run_loop("t", 4, Deadline.never(), 0, 10.0, lambda it, log, clock: None, lambda d, e: None, log_every=1,
                   checkpoint_every=100, progress=False, emit=lambda it, el: _time.sleep(0.2), emit_every=1)
    assert end.done == 4 and 10.0 <= end.elapsed < 10.5  # four 0.2 s callbacks (0.8 s) are not attack time
    # nor are they charged to the deadline: 0.2 s of 20-ms steps, each followed by a 0.1-s callback, is about ten steps
    # (charged, the deadline would pass within two); a loaded machine stretches the sleeps, hence the wide bounds
    end = run_loop("t", 100, Deadline.after(0.2), 0, 0.0, lambda it, log, clock: _time.sleep(0.02), lambda d, e: None,
                   log_every=1, checkpoint_every=100, progress=False, emit=lambda it, el: _time.sleep(0.1), emit_every=1)
    assert 4 <= end.done <= 11 and 0.2 <= end.elapsed < 0.5


@pytest.mark.parametrize("method, arch, task, classes", [
    ("kkt", "convnet:4;fc=8", "multiclass", 3),  # BatchNorm buffers: the λ scale's Euler check runs on the float64 copy
    ("bilevel", "mlp:8;bias=all", "binary", 1),
])
def test_attacks_leave_the_callers_module_as_it_is_in_float64(method, arch, task, classes):
    from exhume.models import build_model

    model = build_model(arch, (1, 8, 8), classes).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    view = AttackerView(model=model, task=task, input_shape=(1, 8, 8), mean=torch.zeros(1, 8, 8),
                        num_classes=classes if task == "multiclass" else None, n_train_hint=3,
                        loss="cross-entropy" if task == "multiclass" else "logistic", weight_decay=1e-2)
    recon = get_attack(method, iterations=2, dtype="float64").run(view, progress=False)
    assert recon.candidates.shape[1:] == (1, 8, 8)
    assert all(v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in model.state_dict().items())


#: the settings kkt no longer has, each with a value a user might give (all refused) and the value of its old default
GONE = {"lambda_scale_factor": (0.5, 1.0), "consistency_weight": (1e-3, 0.0), "surrogate": ("layer-scaled", "fixed"),
        "sphere": ("on", "off"), "lr_schedule": ("cosine", "constant"), "mixed_derivative": ("jvp", "double-backward"),
        "keep": ("last", "best"), "momentum": (0.5, 0.9), "snapshot_every": (10, 500), "start_multipliers": ("signed", "auto"),
        "trace": ("off", "auto")}


def test_kkt_declares_twenty_six_settings():
    """The run's plumbing (seconds, cadence) and the victim's facts (loss, weight decay) are not kkt's settings."""
    from exhume.attacks.engine.base import MOVED

    assert len(KKTAttack.params) == 26 and not (set(GONE) | set(MOVED)) & set(KKTAttack.params)


@pytest.mark.parametrize("name", sorted(GONE))
def test_a_setting_kkt_no_longer_has_is_refused_by_name_in_one_line(name):
    with pytest.raises(ConfigError, match=rf"attack 'kkt' has no parameter\(s\) {name}; known: ") as err:
        get_attack("kkt", **{name: GONE[name][0]})
    assert "\n" not in str(err.value)


def test_a_checkpoint_written_with_settings_kkt_no_longer_has_resumes_at_their_old_values(tmp_path):
    """A checkpoint whose config holds the old settings at the values that did what kkt does now resumes to the
    uninterrupted result; one that used another value (another algorithm) is refused, naming the setting."""
    torch.manual_seed(0)
    view = AttackerView(model=UserNet(d=12), task="binary", input_shape=(12,), mean=torch.zeros(12), n_train_hint=4)
    kw = dict(lr=1e-3)
    full = get_attack("kkt", iterations=20, **kw).run(view, progress=False, seed=3)
    get_attack("kkt", iterations=10, **kw).run(view, out=tmp_path, progress=False, seed=3)
    path = tmp_path / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    payload["state"]["config"].update({k: old for k, (_, old) in GONE.items()})
    torch.save(payload, path)
    resumed = get_attack("kkt", iterations=20, **kw).run(view, out=tmp_path, resume=True, progress=False, seed=3)
    assert resumed.summary["iterations"] == 20 and torch.allclose(resumed.candidates, full.candidates, atol=1e-6)
    payload["state"]["config"]["sphere"] = "on"
    torch.save(payload, path)
    with pytest.raises(ExhumeError, match="sphere='on' there"):
        get_attack("kkt", iterations=20, **kw).run(view, out=tmp_path, resume=True, progress=False, seed=3)


def test_a_preset_gives_its_settings_the_callers_win_and_the_run_records_its_name():
    preset = PRESETS["haim2022"]
    atk = get_attack("kkt", preset="haim2022")
    assert {k: atk.config[k] for k in preset} == preset and atk.config["preset"] == "haim2022"
    assert preset["optimizer"] == "sgd" and preset["prior"] == "centred" and preset["average_decay"] == 0.0
    mine = get_attack("kkt", preset="haim2022", lr=0.05, prior="display")
    assert mine.config["lr"] == 0.05 and mine.config["prior"] == "display" and mine.config["lr_lambda"] == preset["lr_lambda"]
    assert "preset" not in get_attack("kkt").config
    _, _, view = _toy_victim()
    recon = get_attack("kkt", preset="haim2022", iterations=3).run(view, progress=False)
    assert recon.config["preset"] == "haim2022" and recon.config["dtype"] == "float64" and recon.config["subspace"] == "off"
    assert recon.summary["kept_iterate"].startswith("iterate,")  # average_decay 0: the iterate itself


def test_an_unknown_preset_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ConfigError, match="attack 'kkt' has no preset 'haim2023'; known: haim2022") as err:
        get_attack("kkt", preset="haim2023")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="attack 'bilevel' has no preset 'haim2022'; known: none"):
        get_attack("bilevel", preset="haim2022")


def test_the_portfolios_default_variants_leave_a_presets_settings_alone():
    from exhume.portfolio import make_plan

    plain = make_plan("kkt", 2, workers=1, attack_kwargs={"iterations": 5})
    preset = make_plan("kkt", 2, workers=1, attack_kwargs={"iterations": 5, "preset": "haim2022"})
    assert plain.restarts[1].kwargs["lr_lambda"] == 1e-2  # the alternation of the multipliers' rate ...
    assert "lr_lambda" not in preset.restarts[1].kwargs  # ... is the preset's rate on every restart
    assert all(get_attack("kkt", **r.kwargs).config["lr_lambda"] == PRESETS["haim2022"]["lr_lambda"] for r in preset.restarts)


def test_the_cli_takes_a_preset_and_lists_them(victim_dir, tmp_path, capsys):
    from exhume import load_reconstruction
    from exhume.cli import main

    assert main(["attack", "--list-params"]) == 0
    listing = capsys.readouterr().out
    assert "haim2022" in listing and "presets" in listing
    out = tmp_path / "run"
    assert main(["attack", str(victim_dir), "-o", str(out), "--preset", "haim2022", "-p", "lr=0.05", "--iterations", "2",
                 "--restarts", "1", "--no-progress"]) == 0
    cfg = load_reconstruction(out).config
    assert cfg["preset"] == "haim2022" and cfg["optimizer"] == "sgd" and cfg["lr"] == 0.05
    assert main(["attack", str(victim_dir), "-o", str(tmp_path / "x"), "-p", "sphere=on", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no parameter(s) sphere" in err
