"""kkt's closed-form multipliers (the coefficient-free loss): equal to a reference least squares, differentiated exactly
through the solve, and recovering the training digits of a random-features victim in the law's regime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls
from sklearn.datasets import load_digits
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.kkt.closed_form import RIDGE, closed_form_residual, gradient_rows
from exhume.equations.trajectory import build_equation
from exhume.errors import ConfigError
from exhume.evaluation.ssim import ssim_matrix
from exhume.losses import margin
from exhume.victim import AttackerView
from exhume.victim.law import random_features as random_features_model
from exhume.victim.law import train_full_batch


def random_features(n: int = 4, width: int = 2000, seed: int = 0):
    """A 64 → width ReLU layer (no bias) frozen at its initialisation and a bias-free readout trained from its known start
    on ``n`` sklearn digits (0 against 1): p/(d·n) = width/(64·n)."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target)
    idx = torch.cat([torch.where(labels == 0)[0][: (n + 1) // 2], torch.where(labels == 1)[0][: n // 2]])
    train, y, mean = x[idx], torch.where(labels[idx] == 0, 1.0, -1.0), x.mean(0)
    torch.manual_seed(seed)
    model = random_features_model(64, width)
    start = train_full_batch(model, train, y, mean, steps=300, lr=0.5)
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, start=start, loss="logistic", n_train_hint=n)
    return view, train


def _small(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 1), nn.Flatten(0)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    return model, params, x, torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_the_closed_form_multipliers_are_the_reference_least_squares(nonnegative):
    model, params, x, y = _small()
    _, lam = closed_form_residual(model, x, y, margin, None, nonnegative, params=params)
    J = gradient_rows(model, x, y, margin, None, params=params).T.numpy()
    theta = torch.cat([v.reshape(-1) for v in params.values()]).numpy()
    ref = nnls(J, theta)[0] if nonnegative else np.linalg.lstsq(J, theta, rcond=None)[0]
    assert np.allclose(lam.numpy(), ref, rtol=1e-5, atol=1e-8)
    if nonnegative:
        assert (lam >= 0).all()


def projection_residual(J: torch.Tensor, w: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """``(‖w‖² − vᵀ(A + εI)⁻¹v) / ‖w‖²`` written out (``v = Jw``, ``A = JJᵀ``): the reference :func:`closed_form_residual` is tested against."""
    gram = J @ J.T
    gram = gram + ridge * gram.diagonal().mean().detach() * torch.eye(len(gram), dtype=J.dtype)
    v = J @ w
    return (w @ w - v @ torch.linalg.solve(gram, v)) / (w @ w)


def test_the_gradient_through_the_solve_is_the_explicit_formula_s():
    """The envelope gradient (λ* held fixed) equals autograd through (‖w‖² − vᵀA⁻¹v)/‖w‖² with Φ built differentiably."""
    model, params, x, y = _small()
    x = x.clone().requires_grad_()
    value, _ = closed_form_residual(model, x, y, margin, 5.0, False, params=params)
    (fast,) = torch.autograd.grad(value, x)
    w = torch.cat([v.reshape(-1) for v in params.values()])
    x2 = x.detach().clone().requires_grad_()
    reference = projection_residual(gradient_rows(model, x2, y, margin, 5.0, params=params), w)
    (slow,) = torch.autograd.grad(reference, x2)
    assert torch.allclose(value / (w @ w), reference, rtol=1e-6, atol=1e-9)
    assert torch.allclose(fast / (w @ w), slow, rtol=1e-5, atol=1e-9 * float(slow.abs().max()))


def test_the_start_s_share_is_fitted_jointly_with_the_multipliers():
    model, params, x, y = _small()
    gen = torch.Generator().manual_seed(3)
    start = {k: 0.9 * v + 0.1 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params.items()}
    view = AttackerView(model=model, task="binary", input_shape=(5,), mean=torch.zeros(5), start=start)
    eq = build_equation(view, model, params, "trajectory", 3, "fit")
    value, lam = closed_form_residual(model, x, y, margin, None, False, eq=eq)
    J = gradient_rows(model, x, y, margin, None, eq=eq)
    d = torch.cat([eq.direction[k].reshape(-1) for k in eq.names])
    t = torch.cat([eq.target[k].reshape(-1) for k in eq.names])
    rows = torch.cat([J, d[None]]).T
    coef = torch.linalg.lstsq(rows, t[:, None]).solution[:, 0]
    assert lam.shape == (3, 1) and torch.allclose(lam[:, 0], coef[:3], rtol=1e-5, atol=1e-6 * float(coef.abs().max()))
    assert torch.isclose(value, ((t - rows @ coef) ** 2).sum(), rtol=1e-5)


def test_a_random_features_victim_s_training_digits_are_recovered_with_closed_form_multipliers():
    view, train = random_features()
    recon = get_attack("kkt", multipliers="closed-form", lr=3e-2, iterations=300).run(view, progress=False)
    best = ssim_matrix(train, recon.candidates.clamp(0, 1)).max(1).values
    assert recon.config["multipliers_solved"].startswith("closed-form")
    assert recon.config["start_gradient_points_used"].startswith("1 of 2")  # the readout enters linearly
    assert best.min() > 0.8, best
    assert recon.summary["final_relative_stationarity"] < 0.05


@pytest.mark.parametrize("kwargs,message", [({"multipliers": "solved"}, "multipliers"), ({"multipliers": None}, "multipliers")])
def test_bad_closed_form_settings_are_refused_by_name(kwargs, message):
    view, _ = random_features(n=2, width=50)
    with pytest.raises(ConfigError, match=message):
        get_attack("kkt", iterations=1, **kwargs).run(view, progress=False)


def test_minmax_candidate_scale_matches_a_dimmed_reconstruction_and_treats_the_control_alike():
    """A candidate that is a training digit at a third of its brightness: clipped it stays dim, rescaled by its own range it
    is the digit; the control images, judged against the same rescaled candidates, gain nothing."""
    import exhume
    from exhume.attacks import Reconstruction, RunRecord
    from exhume.data.datasets import load_bundled_mnist
    from exhume.evaluation.run import scaled_candidates

    ds = load_bundled_mnist()
    idx = torch.randperm(len(ds.images), generator=torch.Generator().manual_seed(0))
    images = torch.tensor(ds.images)[idx]
    train, unseen = images[:8], images[8:260]
    recon = Reconstruction("kkt", candidates=train / 3.0, labels=torch.ones(8), scores=None, record=RunRecord(), seed=0)
    clip = exhume.evaluate(recon, train=(train, None), unseen=unseen, figures=False).metrics
    minmax = exhume.evaluate(recon, train=(train, None), unseen=unseen, figures=False, candidate_scale="minmax").metrics
    assert minmax["one_to_one_ssim_mean"] > 0.99 > clip["one_to_one_ssim_mean"]
    assert minmax["memorised"] == 8 and minmax["memorised_control"] == 0 and minmax["candidate_scale"].startswith("each candidate")
    assert torch.equal(scaled_candidates(recon.candidates, "clip"), recon.candidates.clamp(0, 1))
    with pytest.raises(ConfigError, match="candidate_scale"):
        scaled_candidates(recon.candidates, "affine")


def test_merged_gradient_points_leave_the_learned_equation_as_it_was_and_a_nonlinear_one_whole():
    """Where the readout alone is trained its gradient is the same at both endpoints: the one-point equation with each
    candidate's multipliers summed is the two-point one (any multipliers); a model trained throughout keeps both points."""
    from exhume.attacks.kkt.closed_form import one_point
    from exhume.equations.trajectory import start_residual

    view, _ = random_features(width=300)
    model = view.model.double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    dview = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=view.mean.double(),
                         start={k: v.double() for k, v in view.start.items()}, loss="logistic", n_train_hint=4)
    eq = build_equation(dview, model, params, "endpoints", 4)
    mean = view.mean.double()
    merged = one_point(model, eq, mean, torch.tensor([1.0, -1.0]).double(), margin)
    assert len(eq.points) == 2 and len(merged.points) == 1 and merged.info["gradient_points_used"].startswith("1 of 2")
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    lam = torch.rand(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    two, _ = start_residual(model, eq, x, y, lam, None, margin)
    one, _ = start_residual(model, merged, x, y, lam.sum(1, keepdim=True), None, margin)
    assert torch.allclose(two, one, rtol=1e-10)
    recon = get_attack("kkt", iterations=3).run(view, progress=False)  # learned multipliers merge the points too
    assert recon.config["start_gradient_points_used"].startswith("1 of 2")
    mlp, mparams, _, _ = _small()
    mview = AttackerView(model=mlp, task="binary", input_shape=(5,), mean=torch.zeros(5),
                         start={k: v - 0.1 for k, v in mparams.items()})
    full = build_equation(mview, mlp, mparams, "endpoints", 3)
    assert one_point(mlp, full, torch.zeros(5, dtype=torch.float64), torch.tensor([1.0, -1.0]).double(), margin) is full
