"""The zoo's reference recipe (benchmarks/zoo/reference.py) computes the published loss exactly."""

from __future__ import annotations

import torch
from torch import nn

from exhume_benchmarks.zoo.reference import RECIPE, reference_loss


def test_reference_loss_equals_a_hand_computation_on_a_tiny_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 1, bias=False), nn.Flatten(0)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    m = 6
    x = torch.randn(m, 4, dtype=torch.float64) * 0.9
    y = torch.tensor([1.0, 1, 1, -1, -1, -1], dtype=torch.float64)
    lam = torch.tensor([0.1, 0.5, 0.9, 0.3, 0.42, 1.2], dtype=torch.float64)
    loss, stat = reference_loss(model, params, x, y, lam, alpha=None)

    # by hand: per-candidate gradients of Φ, one tensor at a time
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for j in range(m):
        grads = torch.autograd.grad(model(x[j:j + 1]).sum(), list(model.parameters()))
        for (k, _), g in zip(model.named_parameters(), grads):
            total[k] += lam[j] * y[j] * g / m
    hand_stat = sum(((params[k] - total[k]) ** 2).sum() for k in params)
    hand_prior = sum(max(v - 1, 0.0) ** 2 + max(-1 - v, 0.0) ** 2 for v in x.flatten().tolist())
    hand_dual = sum(max(RECIPE["lambda_min"] - v, 0.0) ** 2 for v in lam.tolist())
    assert torch.allclose(stat, hand_stat, rtol=1e-10)
    assert abs(float(loss) - float(hand_stat + hand_prior + 5.0 * hand_dual)) < 1e-9 * max(1.0, float(loss))
    assert hand_prior > 0 and hand_dual > 0  # both penalties are active in this example
