"""The audit's no-weight-decay KKT residual: the memory-bounded Gram path equals the direct QR path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import exhume.evaluation.residuals as residuals  # the residual lives with the evaluation: it reads the training set
from exhume.equations.kinds import Stationarity
from exhume.evaluation.assumptions import checks_for
from exhume.evaluation.residuals import kkt_residual_nnls


def _mlp(seed: int, d: int = 12, h: int = 9) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, h, bias=False), nn.ReLU(), nn.Linear(h, 1, bias=False), nn.Flatten(0)).double()


def test_a_linear_model_is_a_kkt_point_exactly_when_its_weights_are_a_positive_combination_on_both_paths():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    u = torch.randn(6, generator=g, dtype=torch.float64)
    y = torch.sign(x @ u)  # linearly separable by u: every y_i x_i has a positive inner product with u
    lam = torch.rand(40, generator=g, dtype=torch.float64)
    lam[::3] = 0.0
    model = nn.Sequential(nn.Linear(6, 1, bias=False), nn.Flatten(0)).double()
    gram_path = 2 * 8 * 6 * 5 + 3 * 8 * 40 * 40  # five columns at a time
    with torch.no_grad():  # θ = Σ λ_i y_i x_i: the gradient of margin_i = y_i wᵀx_i is y_i x_i
        model[0].weight.copy_((lam * y) @ x)
    assert kkt_residual_nnls(model, x, y) < 1e-7
    assert kkt_residual_nnls(model, x, y, memory=gram_path) < 1e-6
    with torch.no_grad():  # θ = −u: the nearest point of the cone of the y_i x_i is 0, the residual 1
        model[0].weight.copy_(-u)
    assert kkt_residual_nnls(model, x, y) == pytest.approx(1.0, abs=1e-9)
    assert kkt_residual_nnls(model, x, y, memory=gram_path) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("n", [25, 200])  # fewer and more points than the 117 parameters
def test_the_gram_path_equals_the_qr_path_on_a_relu_network(n):
    model = _mlp(n)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 12, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    direct = kkt_residual_nnls(model, x, y)
    p = sum(v.numel() for v in model.parameters())
    assert 3 * 8 * p * n <= residuals.LIMITS.gradient_matrix_bytes  # the default takes the direct path here
    block = 7
    gram = kkt_residual_nnls(model, x, y, memory=2 * 8 * p * block + 3 * 8 * n * n)
    assert 0.0 < direct < 1.0
    assert gram == pytest.approx(direct, rel=1e-6, abs=1e-9)


def test_a_residual_that_does_not_fit_is_not_measured_and_makes_the_check_fail(monkeypatch):
    model = _mlp(3)
    x = torch.randn(30, 12, dtype=torch.float64)
    y = torch.ones(30, dtype=torch.float64)
    assert kkt_residual_nnls(model, x, y, memory=3 * 8 * 30 * 30 - 1) is None
    monkeypatch.setattr(residuals, "LIMITS", dataclasses.replace(residuals.LIMITS, gradient_matrix_bytes=1000))
    checks = checks_for(Stationarity())
    measured = checks.residual(model.float(), x.float(), y.float(), "logistic", 0.0)
    assert measured["value"] is None and "LIMITS.gradient_matrix_bytes" in measured["definition"]
    (failure,) = checks.residual_failures(measured)
    assert "could not be checked" in failure
