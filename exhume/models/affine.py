"""The affine classifier of Runkel et al.: ``Φ(x) = x·θ_w + θ_b`` on the flattened input."""

from __future__ import annotations

import torch
from torch import nn


class Affine(nn.Module):
    """``in_features → out_features`` with one linear map (and a bias unless ``bias=False``)."""

    def __init__(self, in_features: int, out_features: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.in_features = int(in_features)
        self.linear = nn.Linear(int(in_features), int(out_features), bias=bool(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x.flatten(1))
        return out.squeeze(-1) if out.shape[-1] == 1 else out
