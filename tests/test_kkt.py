"""The stationarity attack: torch.func path against a plain autograd reference, the surrogate
ReLU, recovery on Haim's 2D toy, any nn.Module, resume, and parameter validation."""

from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.formulation import NO_DECAY_MARGIN, typical_margin
from exhume.attacks.kkt import KKTAttack, consistency_term
from exhume.attacks.stationarity import homogeneity_degree, stationarity_residual, stationarity_residual_and_objective
from exhume.attacks.surrogate import soft_activations, soft_relu
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
    recon = get_attack("kkt", iterations=1000, optimizer="sgd", lr=0.001, init_scale=0.01,
                       lr_schedule="constant").run(view, progress=False, seed=0)
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


def test_the_consistency_term_vanishes_at_the_training_points_multipliers():
    """λ_i = σ(−margin_i)/(n·w) on a victim trained with weight decay and the logistic loss: the
    stationarity equation holds with these multipliers, and the consistency term is zero there."""
    x, margins, view = _toy_victim()
    n_w = 20 * 1e-3
    lam = torch.sigmoid(-margins) / n_w
    params = {k: v.detach() for k, v in view.model.named_parameters()}
    y = (margins / view.model(x - view.mean).detach()).round()  # the training labels, ±1
    theta2 = sum((v**2).sum() for v in params.values())

    def residual(scale: float):
        r, h = stationarity_residual_and_objective(view.model, params, x - view.mean, y, scale * lam)
        return float(r / theta2), h

    r, h = residual(1.0)
    # the victim is close to stationary with these multipliers (20,000 epochs), and far from it with half or twice them
    assert r < 0.05 and 5 * r < residual(0.5)[0] and 5 * r < residual(2.0)[0]
    assert torch.allclose(h, margins, rtol=1e-5, atol=1e-6)
    assert float(consistency_term(lam, h, n_w)) < 1e-10
    assert float(consistency_term(2 * lam, h, n_w)) == pytest.approx(float(torch.log(torch.tensor(2.0))) ** 2, rel=1e-5)


@pytest.mark.parametrize("weight_decay, task, loss, message", [
    (0.0, "binary", "logistic", "weight decay w > 0"),
    (1e-3, "regression", "squared", "margin formulation of a classifier"),
    (1e-3, "binary", "squared", "logistic or cross-entropy loss"),
    (1e-3, "binary", None, "pass loss="),
])
def test_consistency_needs_weight_decay_a_margin_and_a_logistic_loss(weight_decay, task, loss, message):
    view = AttackerView(model=UserNet(), task=task, input_shape=(5,), mean=torch.zeros(5), loss=loss,
                        weight_decay=weight_decay, n_train_hint=4)
    with pytest.raises(ConfigError, match=message):
        get_attack("kkt", iterations=1, consistency_weight=1e-3).run(view, progress=False)


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
    # a portfolio variant scales the estimate; the recorded value is the one the attack used
    halved = get_attack("kkt", iterations=1, lambda_scale_factor=0.5).run(view, progress=False)
    assert halved.config["lambda_scale_value"] == pytest.approx(scaled.config["lambda_scale_value"] * 0.5, rel=1e-6)


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
    recon = get_attack("kkt", iterations=60, lr=1e-3, log_every=10).run(view, progress=False)
    assert recon.candidates.shape == (8, 3, 4)
    hist = [h["stationarity"] for h in recon.loss_history]
    assert hist[-1] < hist[0]


@pytest.mark.parametrize("schedule", ["constant", "cosine"])  # the default, and the schedule that reads the iteration
def test_resume_continues_exactly_where_the_interrupted_run_stopped(tmp_path, schedule):
    torch.manual_seed(0)
    model = UserNet(d=12)
    view = AttackerView(model=model, task="binary", input_shape=(12,), mean=torch.zeros(12), n_train_hint=4)
    kw = dict(lr=1e-3, checkpoint_every=20, snapshot_every=20, lr_schedule=schedule)  # with the averaged snapshot

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    full = get_attack("kkt", iterations=80, **kw).run(view, progress=False, seed=3)
    with pytest.raises(KeyboardInterrupt):  # interrupted at 40 (Ctrl-C saves a checkpoint)
        get_attack("kkt", iterations=80, **kw).run(view, out=tmp_path, progress=False, seed=3, callback=ctrl_c, callback_every=40)
    assert (tmp_path / "checkpoint.pt").exists()
    resumed = get_attack("kkt", iterations=80, **kw).run(view, out=tmp_path, resume=True, progress=False, seed=3)
    assert resumed.summary["iterations"] == 80
    assert torch.allclose(resumed.candidates, full.candidates, atol=1e-6)
    assert torch.allclose(resumed.scores, full.scores, atol=1e-6)
    with pytest.raises(ExhumeError, match="lr"):
        get_attack("kkt", iterations=90, lr=5e-3, checkpoint_every=20).run(view, out=tmp_path, resume=True, progress=False, seed=3)


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
        ({"lambda_scale_factor": 0.0}, "lambda_scale_factor must be >= 1e-06"),
        ({"prior": "box"}, "prior must be one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"lambda_scale": -2}, "lambda_scale"),
        ({"momentum": 1.5}, "momentum must be <= 1"),
        ({"m": 0}, "m must be >= 1"),
        ({"candidates_per_point": 0.0}, "candidates_per_point must be >= 0.001"),
        ({"tv_weight": -1e-4}, "tv_weight must be >= 0"),
        ({"consistency_weight": -1.0}, "consistency_weight must be >= 0"),
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

    from exhume.attacks.loop import run_loop

    saved, history = [], []

    def step(it, log, clock):
        if it == 5:
            raise KeyboardInterrupt
        if log:
            history.append(it)

    with pytest.raises(KeyboardInterrupt):
        run_loop("t", 10, None, 0, 0.0, step, lambda done, el: saved.append(done), log_every=2, checkpoint_every=3,
                 progress=False)
    assert saved == [3, 4] and history == [1, 2, 4]  # the periodic checkpoint, then the last completed step

    end = run_loop("t", 4, None, 0, 10.0, lambda it, log, clock: None, lambda d, e: None, log_every=1,
                   checkpoint_every=100, progress=False, emit=lambda it, el: _time.sleep(0.2), emit_every=1)
    assert end.done == 4 and 10.0 <= end.elapsed < 10.2  # four 0.2 s callbacks are not attack time


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


def test_holding_the_training_points_fixed_leaves_almost_nothing_of_theta():
    from exhume.attacks.stationarity import fixed_part
    from exhume.losses import margin

    x, margins, view = _toy_victim()
    params = {k: v.detach() for k, v in view.model.named_parameters()}
    y = (margins / view.model(x - view.mean).detach()).round()
    target, lam, share = fixed_part(view.model, params, x - view.mean, y, margin)
    assert share > 0.98 and (lam >= 0).all()
    rest = sum((target[k].double() ** 2).sum() for k in params)
    theta2 = sum((v.double() ** 2).sum() for v in params.values())
    assert float(rest / theta2) == pytest.approx(1 - share, rel=1e-3)
    # half of them explain less
    assert fixed_part(view.model, params, x[:10] - view.mean, y[:10], margin)[2] < share - 0.05


def test_a_deflated_run_finds_the_points_the_fixed_candidates_leave():
    """The three training points nearest the boundary are left out of the fixed set: six free
    candidates solving for what the other seventeen leave find them; the same six candidates on
    the whole of θ do not (3,000 iterations each, seed 0)."""
    x, margins, view = _toy_victim()
    y = (margins / view.model(x - view.mean).detach()).round()
    missing, keep = margins.argsort()[:3], margins.argsort()[3:]
    atk = get_attack("kkt", iterations=3000, m=6)
    deflated = atk.run(view, progress=False, seed=0, fixed=(x[keep], y[keep]))
    plain = atk.run(view, progress=False, seed=0)
    assert deflated.config["fixed_candidates"] == 17 and deflated.config["fixed_share_explained"] > 0.9
    d_deflated = torch.cdist(x[missing], deflated.candidates).min(1).values
    d_plain = torch.cdist(x[missing], plain.candidates).min(1).values
    assert d_deflated.max() < 0.2 < d_plain.min()


@pytest.mark.parametrize("fixed, message", [
    ((torch.zeros(3, 2),), "pair of tensors"),
    ((torch.zeros(3, 5), torch.ones(3)), "shape (k >= 1, 2)"),
    ((torch.zeros(0, 2), torch.ones(0)), "shape (k >= 1, 2)"),
    ((torch.zeros(3, 2), torch.ones(4)), "labels must have shape (3,)"),
    ((torch.full((3, 2), float("nan")), torch.ones(3)), "finite"),
])
def test_bad_fixed_candidates_are_refused(fixed, message):
    _, _, view = _toy_victim()
    with pytest.raises(ConfigError, match=re.escape(message)):
        get_attack("kkt", iterations=2).run(view, progress=False, fixed=fixed)


def test_resume_refuses_other_fixed_candidates(tmp_path):
    x, margins, view = _toy_victim()
    y = (margins / view.model(x - view.mean).detach()).round()
    atk = get_attack("kkt", iterations=20, checkpoint_every=10)
    atk.run(view, out=tmp_path, progress=False, fixed=(x[:5], y[:5]))
    with pytest.raises(ExhumeError, match="fixed"):
        get_attack("kkt", iterations=40, checkpoint_every=10).run(view, out=tmp_path, resume=True, progress=False,
                                                                  fixed=(x[:6], y[:6]))
