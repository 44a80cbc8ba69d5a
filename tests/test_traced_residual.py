"""The stationarity term's traced replay and the one-node surrogate ReLU, each against its reference: equal losses,
gradients in the candidates and the multipliers, and candidates after a short kkt run; the rule that decides tracing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exhume.attacks import get_attack, kkt
from exhume.equations import surrogate
from exhume.equations.stationarity import TracedResidual, negative_loss_objective, output_objective, stationarity_residual_and_objective
from exhume.equations.surrogate import soft_activations, soft_relu, soft_relu_composite, soft_relu_one_node
from exhume.losses import margin, soft_margin
from exhume.models import CNN, MLP
from exhume.victim import AttackerView

ALPHA = 7.0


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny tensors run faster on one thread


def test_the_one_node_soft_relu_has_the_composites_value_and_derivatives_to_second_order():
    z = torch.linspace(-3, 3, 61, dtype=torch.float64).requires_grad_()
    w = torch.randn(61, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for fn in (soft_relu_one_node, soft_relu_composite):
        assert torch.equal(fn(z, ALPHA).detach(), torch.relu(z.detach()))
    firsts, seconds, jvps, mixed = [], [], [], []
    for fn in (soft_relu_one_node, soft_relu_composite):
        (g,) = torch.autograd.grad((w * fn(z, ALPHA)).sum(), z, create_graph=True)
        firsts.append(g.detach())
        seconds.append(torch.autograd.grad(g.sum(), z)[0])
        _, tangent = torch.func.jvp(lambda v, fn=fn: fn(v, ALPHA), (z,), (w,))
        jvps.append(tangent.detach())
        mixed.append(torch.autograd.grad(tangent.sum(), z)[0])  # a reverse pass through the forward-mode derivative
    s = torch.sigmoid(ALPHA * z.detach())
    assert torch.allclose(firsts[0], w * s, rtol=1e-12)
    assert torch.allclose(seconds[0], w * ALPHA * s * (1 - s), rtol=1e-12)
    linear = ALPHA * z.detach() > 20  # where softplus turns linear, the composite's second derivative is 0
    for ours, ref in (firsts, seconds, jvps, mixed):
        assert torch.allclose(ours[~linear], ref[~linear], rtol=1e-10, atol=1e-14)
        assert torch.allclose(ours[linear], ref[linear], rtol=0, atol=2.1e-9 * ALPHA * float(w.abs().max()))


def test_the_soft_relu_works_under_vmap_and_in_the_mode_for_leaky_relu():
    z = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    per_row = torch.func.vmap(torch.func.grad(lambda v: soft_relu_one_node(v, ALPHA).sum()))(z)
    assert torch.allclose(per_row, torch.sigmoid(ALPHA * z), rtol=1e-12)
    big = torch.zeros(surrogate.ONE_NODE_MIN_ELEMENTS, requires_grad=True)
    assert soft_relu(big, ALPHA).grad_fn is not None and "SoftReLU" in type(soft_relu(big, ALPHA).grad_fn).__name__
    assert "SoftReLU" not in type(soft_relu(big[:-1], ALPHA).grad_fn).__name__
    zr = z.clone().requires_grad_()
    with soft_activations(ALPHA):
        out = F.leaky_relu(zr, 0.2)
    assert torch.allclose(out.detach(), F.leaky_relu(z, 0.2), rtol=1e-15)
    (g,) = torch.autograd.grad(out.sum(), zr)
    assert torch.allclose(g, 0.2 + 0.8 * torch.sigmoid(ALPHA * z), rtol=1e-12)


def _victim(arch: str, classes: int):
    torch.manual_seed(3)
    out = 1 if classes == 2 else classes
    if arch == "mlp":
        return MLP(16, (12, 10), out_features=out, bias=True).double(), (1, 4, 4)
    return CNN((2, 8, 8), (3, 4), fc=(6,), out_features=out, pool=arch, bias=True).double(), (2, 8, 8)


def _objective(form: str, classes: int):
    if form == "loss":
        return negative_loss_objective("logistic" if classes == 2 else "cross-entropy")
    return {"margin": margin, "soft-margin": soft_margin, "output": output_objective}[form]


def _grads(residual, model, params, x0, y, lam0, objective, target):
    """The residual's value, its gradients in x and λ, and the margins."""
    x, lam = x0.clone().requires_grad_(), lam0.clone().requires_grad_()
    stat, h = residual(model, params, x, y, lam, ALPHA, objective, target)
    stat.backward()
    return stat.detach(), x.grad, lam.grad, h.detach()


class TwoConvNet(nn.Module):
    """A CNN exhume did not build: functional ReLUs, max and average pooling, biases."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 3, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 2 * 2, 1)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.avg_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1)).squeeze(-1)


@pytest.mark.parametrize(("arch", "classes", "form"), [("mlp", 2, "margin"), ("max", 3, "soft-margin"), ("avg", 2, "loss"),
                                                       ("avg", 3, "margin")])
def test_the_traced_replay_gives_the_eager_loss_and_gradients_step_after_step(arch, classes, form):
    model, shape = _victim(arch, classes)
    params = {k: v.detach() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(6)
    y = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64) if classes == 2 else torch.arange(6) % classes
    target = {k: 0.5 * v for k, v in params.items()}
    obj, traced = _objective(form, classes), TracedResidual()
    for _ in range(2):  # traced on the first call, replayed on the second with other candidates and multipliers
        x0, lam0 = torch.randn(6, *shape, dtype=torch.float64, generator=gen), torch.rand(6, dtype=torch.float64, generator=gen)
        ref = _grads(stationarity_residual_and_objective, model, params, x0, y, lam0, obj, target)
        ours = _grads(traced, model, params, x0, y, lam0, obj, target)
        assert traced.info["residual_traced"]
        for a, b in zip(ours, ref):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-14 * float(b.abs().max()))


def test_a_diverged_first_step_comes_back_non_finite_from_the_replay():
    model, shape = _victim("avg", 2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(4, *shape, dtype=torch.float64, requires_grad=True)
    lam = torch.full((4,), 1e300, dtype=torch.float64, requires_grad=True)  # ‖θ − g‖² overflows
    traced = TracedResidual()
    stat, _ = traced(model, params, x, torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64), lam, ALPHA)
    assert not torch.isfinite(stat) and traced.info["residual_traced"]


class ValueDependentNet(nn.Module):
    """Control flow on a tensor's value: no graph of tensor operations can stand for it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 1)

    def forward(self, x):
        z = torch.relu(self.a(x))
        return self.b(z if z.sum() > 0 else -z).squeeze(-1)


def test_a_module_that_cannot_be_traced_is_left_to_the_eager_path():
    torch.manual_seed(0)
    model = ValueDependentNet().double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x0, lam0 = torch.randn(5, 4, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    traced = TracedResidual()
    ours = _grads(traced, model, params, x0, y, lam0, margin, None)
    ref = _grads(stationarity_residual_and_objective, model, params, x0, y, lam0, margin, None)
    assert not traced.info["residual_traced"] and "cannot be traced" in traced.info["residual_trace_note"]
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_kkt_replays_the_traced_step_and_finds_what_the_eager_steps_find():
    short = get_attack("kkt", iterations=3).run(AttackerView(model=TwoConvNet(), task="binary", input_shape=(1, 8, 8),
                                                             mean=0.2, n_train_hint=2), progress=False)
    assert not short.config["residual_traced"] and "fewer than 1000 iterations" in short.config["residual_trace_note"]
    torch.manual_seed(0)
    view = AttackerView(model=TwoConvNet(), task="binary", input_shape=(1, 8, 8), mean=torch.full((1, 8, 8), 0.2),
                        weight_decay=1e-3, loss="logistic", n_train_hint=4)
    attack = get_attack("kkt", iterations=40, dtype="float64", tv_weight=1e-4)
    runs = {t: attack.run(view, progress=False, trace=t) for t in (True, False)}  # traced from the first step, or eager
    assert runs[True].config["residual_traced"] and not runs[False].config["residual_traced"]
    assert "asked for" in runs[False].config["residual_trace_note"]
    assert torch.allclose(runs[True].candidates, runs[False].candidates, rtol=0, atol=1e-7)
    closed = get_attack("kkt", iterations=2, multipliers="closed-form").run(view, progress=False, trace=True)
    assert not closed.config["residual_traced"] and "closed-form" in closed.config["residual_trace_note"]


def test_trace_auto_is_decided_by_the_runs_settings_never_by_the_clock():
    """The same seed and iterations give the same numbers on an idle or a loaded machine: the switch to the traced
    replay (whose last bits differ from the eager path's) is a function of the budget, not of elapsed seconds."""
    assert not kkt.traces(kkt.TRACE_MIN_ITERATIONS - 1, None) and kkt.traces(kkt.TRACE_MIN_ITERATIONS, None)
    assert not kkt.traces(10**6, kkt.TRACE_MIN_SECONDS - 1) and kkt.traces(10, kkt.TRACE_MIN_SECONDS)
