"""Plain convolutional networks for the stationarity attacks (Buzaglo et al.'s CNN victims).

``cnn:16,32;fc=64;pool=max;bias=none;kernel=3;act=relu``: two 3×3 convolutions (16 and 32 channels,
same padding), each followed by the activation and a 2×2 pool (``max``, ``avg`` or ``none``), then
fully connected hidden layers (``fc=64`` or ``fc=64,32``; optional) and the output layer. ``bias``:
``none`` (homogeneous network), ``all``. ``act``: ``relu`` (the papers'), or a smooth one, ``gelu``
or ``softplus``, where the stationarity equation holds with no choice of derivative at a kink.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: the activations a cnn spec may name (``act=``)
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "softplus": nn.Softplus}


class CNN(nn.Module):
    def __init__(self, input_shape: Sequence[int], channels: Sequence[int], fc: Sequence[int] = (), out_features: int = 1,
                 pool: str = "max", bias: bool = False, kernel: int = 3, act: str = "relu") -> None:
        super().__init__()
        c, h, w = (int(s) for s in input_shape)
        layers: list[nn.Module] = []
        make_act = ACTIVATIONS[act]
        for ch in channels:
            layers += [nn.Conv2d(c, int(ch), kernel, padding=kernel // 2, bias=bias), make_act()]
            if pool == "max":
                layers.append(nn.MaxPool2d(2))
            elif pool == "avg":
                layers.append(nn.AvgPool2d(2))
            if pool != "none":
                h, w = h // 2, w // 2
            c = int(ch)
        self.features = nn.Sequential(*layers)
        dims = [c * h * w, *[int(f) for f in fc], int(out_features)]
        head: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            head.append(nn.Linear(a, b, bias=bias))
            if i < len(dims) - 2:
                head.append(make_act())
        self.head = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.features(x).flatten(1))
        return out.squeeze(-1) if out.shape[-1] == 1 else out
