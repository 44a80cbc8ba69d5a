"""The TLDR paper's classifier: convolutions, batch norm, leaky ReLU, dropout, FC, softmax.

Spec string ``convnet:32,64;fc=128;dropout=0.25;slope=0.01``:

- ``32,64`` — one block per width: ``Conv2d(3×3, padding 1) → BatchNorm2d → LeakyReLU → MaxPool2d(2)``;
- ``fc=128`` — hidden fully connected widths (comma-separated with ``+``, e.g. ``fc=256+128``),
  each ``Linear → LeakyReLU → Dropout``; ``fc=0`` for none;
- ``dropout=0.25`` — dropout after the convolutional stack and after every hidden FC layer;
- ``slope=0.01`` — the leaky ReLU's negative slope.

The module returns logits; the softmax of the paper's classifier is applied by the
cross-entropy loss (and by the inversion attacks, which read ``softmax(logits)``). The last
``nn.Linear`` (``self.head``) maps the last hidden layer's features to the logits: the inversion
attacks hook its input. Dropout and batch norm behave as in training only in ``.train()`` mode;
a victim is saved and attacked in ``.eval()`` mode (batch-norm running statistics, which are
buffers in ``state_dict`` and so travel in ``model.safetensors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from exhume.errors import ConfigError

DEFAULTS: dict[str, Any] = {"widths": [32, 64], "fc": [128], "dropout": 0.25, "slope": 0.01}


class ConvNet(nn.Module):
    def __init__(self, input_shape: Sequence[int], num_classes: int, widths: Sequence[int] = (32, 64),
                 fc: Sequence[int] = (128,), dropout: float = 0.25, slope: float = 0.01) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"convnet needs image inputs (C, H, W), got input shape {tuple(input_shape)}")
        c, h, w = (int(s) for s in input_shape)
        blocks: list[nn.Module] = []
        for width in widths:
            if min(h, w) < 2:
                raise ConfigError(f"convnet: input {tuple(input_shape)} is too small for {len(widths)} pooling blocks")
            blocks += [nn.Conv2d(c, int(width), 3, padding=1), nn.BatchNorm2d(int(width)), nn.LeakyReLU(slope), nn.MaxPool2d(2)]
            c, h, w = int(width), h // 2, w // 2
        blocks += [nn.Dropout(dropout), nn.Flatten()]
        self.features = nn.Sequential(*blocks)
        dims = [c * h * w, *[int(f) for f in fc]]
        hidden: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            hidden += [nn.Linear(a, b), nn.LeakyReLU(slope), nn.Dropout(dropout)]
        self.hidden = nn.Sequential(*hidden)
        self.head = nn.Linear(dims[-1], int(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.features(x)))


def parse_convnet(body: str, opts: list[str], text: str) -> dict[str, Any]:
    """``32,64`` and ``["fc=128", "dropout=0.25", ...]`` into a spec dict."""
    spec: dict[str, Any] = {"type": "convnet", **{k: (list(v) if isinstance(v, list) else v) for k, v in DEFAULTS.items()}}
    if body.strip():
        try:
            spec["widths"] = [int(w) for w in body.split(",") if w.strip()]
        except ValueError:
            raise ConfigError(f"convnet widths must be integers separated by commas, got {body!r} in {text!r}") from None
        if not spec["widths"] or min(spec["widths"]) < 1:
            raise ConfigError(f"convnet needs at least one positive convolution width, got {body!r}")
    for opt in opts:
        key, sep, value = opt.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"architecture option {opt!r} must look like key=value")
        try:
            if key == "fc":
                spec["fc"] = [int(f) for f in value.split("+") if f.strip() and int(f) != 0]
            elif key in ("dropout", "slope"):
                spec[key] = float(value)
            else:
                raise ConfigError(f"unknown convnet option {key!r} in {text!r}; known: fc, dropout, slope")
        except ValueError:
            raise ConfigError(f"convnet option {key} got {value!r}; expected a number") from None
    return spec


def build_convnet(spec: dict[str, Any], input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    s = {**DEFAULTS, **spec}
    if not 0.0 <= float(s["dropout"]) < 1.0:
        raise ConfigError(f"convnet dropout must be in [0, 1), got {s['dropout']}")
    if any(int(f) < 1 for f in s["fc"]):
        raise ConfigError(f"convnet fc widths must be positive, got {s['fc']}")
    if out_features < 2:
        raise ConfigError("convnet is a multiclass classifier: use a multiclass task (e.g. --task multiclass)")
    return ConvNet(input_shape, out_features, s["widths"], s["fc"], float(s["dropout"]), float(s["slope"]))
