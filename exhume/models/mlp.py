"""Multilayer perceptrons as in Haim et al.: ReLU hidden layers, a bias per layer optional."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """``in_features → widths[0] → … → widths[-1] → out_features`` with ReLU between layers.

    ``bias`` is one flag per linear layer (``len(widths) + 1`` of them). ``first_init_scale``
    re-initialises the first layer's weights as ``N(0, 1) · first_init_scale`` (Haim et al. use
    1e-4); ``None`` keeps PyTorch's default initialisation.
    """

    def __init__(
        self,
        in_features: int,
        widths: Sequence[int],
        out_features: int = 1,
        bias: Sequence[bool] | bool = False,
        first_init_scale: float | None = None,
    ) -> None:
        super().__init__()
        dims = [int(in_features), *[int(w) for w in widths], int(out_features)]
        if isinstance(bias, bool):
            bias = [bias] * (len(dims) - 1)
        if len(bias) != len(dims) - 1:
            raise ValueError(f"bias needs {len(dims) - 1} flags (one per layer), got {len(bias)}")
        self.in_features = dims[0]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b, bias=bool(bias[i])))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)
        if first_init_scale is not None:
            with torch.no_grad():
                first = self.net[0]
                first.weight.normal_(0.0, 1.0).mul_(first_init_scale)
                if first.bias is not None:
                    first.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x.flatten(1))
        return out.squeeze(-1) if out.shape[-1] == 1 else out
