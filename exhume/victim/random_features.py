"""Random-features victims: a bias-free ReLU layer frozen at its initialisation and a bias-free readout trained
from its known start by full-batch gradient descent on the logistic loss (labels ±1, inputs centred by ``mean``).

The model family of the law of data reconstruction (Iurada et al. 2026): p = width trained parameters against
d·n unknown pixels, so p/(d·n) is set by the width alone. Shared by the law's benchmarks and tests.
"""

from __future__ import annotations

import torch
from torch import nn


def train_random_features(train: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, width: int, seed: int = 0,
                          steps: int = 300, lr: float = 0.5) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """``(model, start)``: the model (taking centred inputs) after ``steps`` of SGD on its readout, and its start."""
    torch.manual_seed(seed)
    d = int(train[0].numel())
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, width, bias=False), nn.ReLU(), nn.Linear(width, 1, bias=False), nn.Flatten(0))
    model[1].weight.requires_grad_(False)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([model[3].weight], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.softplus(-y * model(train - mean)).mean().backward()
        opt.step()
    return model, start


__all__ = ["train_random_features"]
