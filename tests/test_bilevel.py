"""The bilevel attack: the implicit gradient against a dense solve and finite differences (float64),
the outer loop reducing ‖θ* − θ‖², any nn.Module, resume, and parameter validation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.bilevel.attack import conjugate_gradient, flatten, implicit_gradient, inner_objective, solve_inner
from exhume.attacks.bilevel.lower_level import extreme_eigenvalues, spectral_damping
from exhume.errors import ConfigError
from exhume.models import build_model
from exhume.victim import AttackerView, TrainConfig, train_victim

DT = torch.float64


class TanhNet(nn.Module):
    """A user module (twice differentiable, biases everywhere) that exhume did not build."""

    def __init__(self, d: int = 4, h: int = 3) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, h), nn.Linear(h, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.flatten(1)))).squeeze(-1)


def _problem(kind: str):
    torch.manual_seed(0)
    model = (build_model("affine", (4,), 1) if kind == "affine" else TanhNet()).to(DT)
    like = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(6, 4, dtype=DT)
    y = torch.tensor([1.0, 1, 1, -1, -1, -1], dtype=DT)
    return model, like, x, y


def _lbfgs(model, like, theta0, x, y, wd, steps, tol, beta=None):
    """The lower level by full-batch L-BFGS (strong Wolfe) to ``max|∇_θE| ≤ tol``: a reference for the attack's Newton-CG
    (it stalls on unsmoothed ReLU victims); returns ``θ`` and ``‖∇_θE‖``."""
    from exhume.equations.surrogate import smooth_activations

    def objective(t):
        with smooth_activations(beta):
            return inner_objective(model, like, t, x, y, "logistic", wd)

    theta = theta0.detach().clone().requires_grad_()
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=steps, history_size=20, tolerance_grad=tol, tolerance_change=0.0,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad(set_to_none=True)
        value = objective(theta)
        value.backward()
        return value

    opt.step(closure)
    t = theta.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(objective(t), t)
    return t.detach(), float(g.norm())


def _newton(model, like, theta, x, y, wd, steps=30):
    """Exact inner optimum of the tiny problem by Newton's method with the dense Hessian."""

    def f(t):
        return inner_objective(model, like, t, x, y, "logistic", wd)

    for _ in range(steps):
        g = torch.func.grad(f)(theta)
        theta = theta - torch.linalg.solve(torch.autograd.functional.hessian(f, theta), g)
    return theta


@pytest.mark.parametrize("kind", ["affine", "tanh"])
def test_implicit_gradient_matches_dense_solve_and_finite_differences(kind):
    model, like, x, y = _problem(kind)
    wd, theta_star = 0.1, flatten(like)
    theta0, gnorm = _lbfgs(model, like, theta_star, x, y, wd, 500, 1e-13)
    assert gnorm < 1e-7  # L-BFGS gets close; Newton finishes to machine precision
    theta = _newton(model, like, theta0, x, y, wd)
    ours, p, info = implicit_gradient(model, like, theta, theta_star, x, y, "logistic", wd, cg_iterations=200, cg_tol=1e-13)
    assert not info["negative_curvature"] and info["relative_residual"] < 1e-12

    # exact: −(∂²E/∂x∂θ)ᵀ H⁻¹ ∇_θ l with the dense Hessian and mixed Jacobian
    def grad_theta(t, xx):
        return torch.func.grad(lambda tt: inner_objective(model, like, tt, xx, y, "logistic", wd))(t)

    hess = torch.autograd.functional.jacobian(lambda t: grad_theta(t, x), theta)
    mixed = torch.autograd.functional.jacobian(lambda xx: grad_theta(theta, xx), x)  # (P, m, d)
    exact = -torch.einsum("p...,p->...", mixed, torch.linalg.solve(hess, 2 * (theta - theta_star)))
    assert float((ours - exact).norm() / exact.norm()) < 1e-6

    # independent check: central differences of x ↦ ‖θ* − θ(x)‖² with θ(x) solved by Newton
    def outer(xx):
        return float(((_newton(model, like, theta, xx, y, wd, 8) - theta_star) ** 2).sum())

    eps, fd = 1e-5, torch.zeros_like(x)
    for i in range(x.numel()):
        e = torch.zeros(x.numel(), dtype=DT)
        e[i] = eps
        e = e.view_as(x)
        fd.view(-1)[i] = (outer(x + e) - outer(x - e)) / (2 * eps)
    assert float((ours - fd).norm() / fd.norm()) < 1e-6


def test_conjugate_gradient_solves_spd_system_and_flags_negative_curvature():
    torch.manual_seed(1)
    a = torch.randn(8, 8, dtype=DT)
    spd = a @ a.T + 0.5 * torch.eye(8, dtype=DT)
    b = torch.randn(8, dtype=DT)
    p, info = conjugate_gradient(lambda v: spd @ v, b, None, 50, 1e-12)
    assert torch.allclose(p, torch.linalg.solve(spd, b), atol=1e-9) and not info["negative_curvature"]
    _, info = conjugate_gradient(lambda v: -v, b, None, 50, 1e-12)
    assert info["negative_curvature"]


def _tiny_victim(d: int = 12, n: int = 10, arch: str = "affine"):
    torch.manual_seed(0)
    x = torch.randn(n, d)
    y = torch.tensor([1.0, -1.0] * (n // 2))
    model = build_model(arch, (d,), 1)
    train_victim(model, x, y, TrainConfig(lr=0.5, weight_decay=0.05, max_epochs=3000), progress=False)
    return AttackerView(model=model, task="binary", input_shape=(d,), mean=torch.zeros(d), loss="logistic",
                        weight_decay=0.05, n_train_hint=n)


def test_bilevel_reduces_parameter_distance_on_tiny_victim(tmp_path):
    view = _tiny_victim()
    atk = get_attack("bilevel", iterations=40, lr=0.05, project=False, dtype="float64")
    r = atk.run(view, seed=0, progress=False, out=tmp_path / "a", log_every=1, checkpoint_every=10)
    first = r.loss_history[0]["param_distance"]
    assert r.summary["param_distance"] < 0.05 * first
    assert r.candidates.shape == (10, 12) and r.config["init"] == "noise" and r.config["oracle_init"] is False
    # resume continues the same run from its checkpoint
    more = get_attack("bilevel", iterations=45, lr=0.05, project=False, dtype="float64")
    r2 = more.run(view, seed=0, progress=False, out=tmp_path / "a", resume=True, log_every=1, checkpoint_every=10)
    assert r2.summary["iterations"] == 45 and r2.loss_history[0]["param_distance"] == first


@pytest.fixture(scope="module")
def relu_view():
    return _tiny_victim(arch="mlp:6;bias=all")


def test_newton_cg_reaches_the_stationary_point_of_a_tiny_relu_victim_like_a_long_reference_solve(relu_view):
    model = copy.deepcopy(relu_view.model).to(DT)
    like = {k: v.detach() for k, v in model.named_parameters()}
    torch.manual_seed(3)
    x, y = torch.rand(10, 12, dtype=DT) - 0.5, torch.tensor([1.0, -1.0] * 5, dtype=DT)
    info: dict = {}
    first, gnorm = solve_inner(model, like, flatten(like), x, y, "logistic", 0.05, 50, 1e-10, 100.0, info)
    assert gnorm <= 1e-10 and info["converged"] and info["iterations"] < 50
    # warm start, as in the attack: the candidates move a little, both solvers start from the old θ
    x = x + 0.02 * torch.randn_like(x)
    args = (model, like, first, x, y, "logistic", 0.05)
    ours, gnorm = solve_inner(*args, 50, 1e-10, beta=100.0, info=info)
    assert gnorm <= 1e-10 and info["iterations"] < 20
    ref, ref_g = _lbfgs(model, like, first, x, y, 0.05, 3000, 0.0, beta=100.0)  # the long reference solve
    assert ref_g < 1e-7 and float((ours - ref).norm()) < 1e-6 * (1 + float(ref.norm()))
    # the Hessian there is positive definite, so the spectral damping is zero
    _, _, cg = implicit_gradient(model, like, ours, flatten(like), x, y, "logistic", 0.05, None, beta=100.0)
    assert cg["lambda_min"] > 0 and cg["damping"] == 0.0 and not cg["negative_curvature"]


def test_lanczos_bounds_the_spectrum_and_damping_lifts_an_indefinite_hessian():
    torch.manual_seed(2)
    q, _ = torch.linalg.qr(torch.randn(30, 30, dtype=DT))
    eig = torch.linspace(-0.3, 5.0, 30, dtype=DT)
    a = q @ torch.diag(eig) @ q.T
    lo, hi = extreme_eigenvalues(lambda v: a @ v, 30, torch.zeros(30, dtype=DT), iterations=30)
    assert abs(lo + 0.3) < 1e-8 and abs(hi - 5.0) < 1e-8
    delta = spectral_damping(lo, hi)
    assert float(torch.linalg.eigvalsh(a + delta * torch.eye(30, dtype=DT))[0]) > 0
    assert spectral_damping(0.1, 5.0) == 0.0


def test_bilevel_reduces_parameter_distance_on_a_relu_victim_with_a_converged_lower_level(relu_view):
    r = get_attack("bilevel", iterations=20, lr=0.05, project=False).run(relu_view, seed=0, progress=False, log_every=1)
    hist = r.loss_history
    assert all(h["inner_grad_norm"] <= 1e-9 for h in hist)  # every lower-level solve converges
    assert r.summary["param_distance"] < 0.5 * hist[0]["param_distance"]


def test_bilevel_runs_on_a_relu_network_with_biases_and_labels_oracle_init(relu_view):
    view = relu_view
    init = torch.rand(10, 12)
    r = get_attack("bilevel", iterations=3, damping=1e-3).run(view, init=init, init_name="partition", progress=False)
    assert r.config["oracle_init"] is True and torch.isfinite(r.candidates).all()
    assert r.candidates.min() >= 0 and r.candidates.max() <= 1  # projected onto the display range


def test_bilevel_refuses_bad_arguments():
    view = _tiny_victim()
    with pytest.raises(ConfigError, match="no parameter"):
        get_attack("bilevel", step=3)
    with pytest.raises(ConfigError, match="optimizer"):
        get_attack("bilevel", optimizer="lbfgs")
    with pytest.raises(ConfigError, match="inner_solver: removed"):
        get_attack("bilevel", inner_solver="lbfgs")
    with pytest.raises(ConfigError, match="cg_iterations"):
        get_attack("bilevel", cg_iterations=0)
    no_wd = AttackerView(model=view.model, task="binary", input_shape=(12,), mean=torch.zeros(12))
    with pytest.raises(ConfigError, match="weight_decay"):
        get_attack("bilevel").run(no_wd, progress=False)
    multi = AttackerView(model=build_model("affine", (12,), 3), task="multiclass", input_shape=(12,), mean=torch.zeros(12),
                         weight_decay=0.1, num_classes=3)
    with pytest.raises(ConfigError, match="binary"):
        get_attack("bilevel").run(multi, progress=False)
    with pytest.raises(ConfigError, match="init"):
        get_attack("bilevel", m=10).run(view, init=torch.rand(4, 12), progress=False)


def test_bilevel_keeps_a_three_second_budget_inside_its_inner_solves(tmp_path):
    """On MNIST-sized inputs one outer step (a cold Newton-CG solve) takes far longer than 3 s: the solves check the
    budget every Hessian-vector product, so the run ends within 5 s, its last step abandoned, the result honest."""
    import time

    import exhume
    from exhume.files.runfolder import fingerprint

    torch.manual_seed(0)
    model = build_model("mlp:16", (1, 28, 28), 1)
    view = AttackerView(model=model, task="binary", input_shape=(1, 28, 28), mean=torch.full((1, 28, 28), 0.13),
                        loss="logistic", weight_decay=5e-3, n_train_hint=20)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # torch imports its compiler on the first optimiser: not the attack's time
    fingerprint(model)
    t0 = time.perf_counter()
    r = exhume.attack(view, method="bilevel", max_seconds=3.0, out=tmp_path / "run", progress=False)
    wall = time.perf_counter() - t0
    assert wall < 5.0 and r.summary["seconds"] <= wall, (wall, r.summary)
    assert isinstance(r.summary["final_inner_stopped_by_budget"], bool) and torch.isfinite(r.candidates).all()
    ckpt = tmp_path / "run" / "checkpoint.pt"  # none when not one step completed
    saved = torch.load(ckpt, weights_only=True)["state"]["iteration"] if ckpt.exists() else 0
    assert saved == r.summary["iterations"]  # the abandoned step is not counted, nor saved half done
