"""The model families of the law of data reconstruction, built at a chosen ``p/(d·n)`` and trained from PyTorch's init.

Three families, named as :func:`family_of` names them (the law's experiment labels its victims with it
and the audit reads an audited model's family with it, so the two always agree):

- ``random-features``: a bias-free ``d → width`` ReLU layer frozen at its initialisation and a
  bias-free readout, the only trained parameters;
- ``two-layer-mlp``: ``d → width → 1`` with ReLU and PyTorch's default biases, every parameter trained;
- ``cnn``: convolutions with ReLU and a linear readout, every parameter trained (:func:`small_cnn`).

Every victim takes centred inputs (the data mean subtracted) and is trained by full-batch gradient
descent on the logistic loss (labels ±1) from its known start; ``p`` counts the trained parameters.
"""

from __future__ import annotations

import torch
from torch import nn

FAMILIES = ("random-features", "two-layer-mlp", "cnn")
#: parameter-free layers a family may hold besides its Linear/Conv2d layers and ReLUs
_PLAIN = (nn.Flatten, nn.Unflatten, nn.Identity, nn.AvgPool2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Dropout, nn.Sequential)


def two_layer_mlp(d: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(d, width), nn.ReLU(), nn.Linear(width, 1), nn.Flatten(0))


def random_features(d: int, width: int) -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, width, bias=False), nn.ReLU(), nn.Linear(width, 1, bias=False), nn.Flatten(0))
    model[1].weight.requires_grad_(False)
    return model


def small_cnn(shape: tuple[int, int, int], channels: int) -> nn.Module:
    """``conv 3×3 (channels) → ReLU → 2×2 average pool → linear readout``: ``p ≈ channels·(9·C + 1 + H·W/4)``."""
    c, h, w = shape
    return nn.Sequential(nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(channels * (h // 2) * (w // 2), 1), nn.Flatten(0))


def build(family: str, shape: tuple[int, int, int], width: int) -> nn.Module:
    d = shape[0] * shape[1] * shape[2]
    return {"random-features": lambda: random_features(d, width), "two-layer-mlp": lambda: two_layer_mlp(d, width),
            "cnn": lambda: small_cnn(shape, width)}[family]()


def trained_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def width_for(family: str, shape: tuple[int, int, int], n: int, ratio: float) -> int:
    """The width (features, hidden units or channels) whose trained parameters come nearest ``ratio·d·n`` (in log)."""
    import math

    d = shape[0] * shape[1] * shape[2]
    goal = ratio * d * n
    per = max(1, trained_count(build(family, shape, 2)) - trained_count(build(family, shape, 1)))
    width = max(1, round(goal / per))
    while width > 1 and trained_count(build(family, shape, width - 1)) >= goal:
        width -= 1
    while trained_count(build(family, shape, width)) < goal:
        width += 1
    if width > 1 and math.log(goal / trained_count(build(family, shape, width - 1))) < math.log(trained_count(build(family, shape, width)) / goal):
        width -= 1
    return width


def train_full_batch(model: nn.Module, train: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, steps: int,
                     lr: float) -> dict[str, torch.Tensor]:
    """Full-batch gradient descent on the logistic loss from the model's current weights; returns that start."""
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.softplus(-y * model(train - mean)).mean().backward()
        opt.step()
    return start


def family_of(model: nn.Module, start: dict[str, torch.Tensor] | None) -> str | None:
    """The family of :data:`FAMILIES` the model belongs to, or None (another architecture, another activation, or,
    without a start, a random-features model that cannot be told from a two-layer MLP: both read as the MLP)."""
    leaves = [m for m in model.modules() if not list(m.children())]
    weighted = [m for m in leaves if isinstance(m, (nn.Linear, nn.Conv2d))]
    if any(not isinstance(m, (nn.Linear, nn.Conv2d, nn.ReLU, *_PLAIN)) for m in leaves) or not weighted:
        return None
    if not any(isinstance(m, nn.ReLU) for m in leaves) or not isinstance(weighted[-1], nn.Linear):
        return None
    frozen = _frozen_modules(model, start)
    if any(isinstance(m, nn.Conv2d) for m in weighted):
        return "cnn" if not frozen else None
    if len(weighted) != 2:
        return None
    if not frozen:
        return "two-layer-mlp"
    first, last = weighted
    plain = first.bias is None and last.bias is None
    return "random-features" if plain and frozen == {id(first)} else None


def _frozen_modules(model: nn.Module, start: dict[str, torch.Tensor] | None) -> set[int]:
    """ids of the weighted modules whose every parameter equals its start (none without a start)."""
    if start is None:
        return set()
    out = set()
    for name, m in model.named_modules():
        params = dict(m.named_parameters(recurse=False))
        keys = [f"{name}.{k}" if name else k for k in params]
        if params and all(k in start and torch.equal(start[k].to(p), p.detach()) for k, p in zip(keys, params.values())):
            out.add(id(m))
    return out


__all__ = ["FAMILIES", "build", "family_of", "train_full_batch", "trained_count", "width_for"]
