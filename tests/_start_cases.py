"""Small known-start cases shared by the known-start tests (test_start.py, test_start_files.py, test_start_audit.py)."""

from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, d: int = 6, h: int = 8, out: int = 1) -> None:
        super().__init__()
        self.a = nn.Linear(d, h)
        self.b = nn.Linear(h, out)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.flatten(1)))).squeeze(-1)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fine_tuned(seed: int = 0):
    """A 16-64-1 MLP pre-trained on 40 random images, then fine-tuned on 4 others (50 steps of SGD)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    gen = torch.Generator().manual_seed(seed)
    xp, yp = torch.rand(40, 1, 4, 4, generator=gen), torch.where(torch.rand(40, generator=gen) > 0.5, 1.0, -1.0)
    for x, y, steps in ((xp, yp, 200), (torch.rand(4, 1, 4, 4, generator=gen), torch.tensor([1.0, -1, 1, -1]), 50)):
        if steps == 50:
            start, train = state(model), x
        opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-3)
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.softplus(-y * model(x - 0.5)).mean().backward()
            opt.step()
    return model, start, train


def forgotten(seed: int = 0):
    """A 16-64-1 MLP trained with Adam and strong (coupled) weight decay on 4 images until 7 % of its start is left."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    start = state(model)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.rand(4, 1, 4, 4, generator=gen), torch.tensor([1.0, -1, 1, -1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(1000):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x - 0.5)).mean().backward()
        opt.step()
    return model, start, x
