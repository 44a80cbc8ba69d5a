"""The TLDR conditioned generator: latent (+ conditioning) → transposed convolutions → image.

Four conditionings (the TLDR paper, §3.2), for an N-class classifier:

- ``label``: a learnt embedding of the label, concatenated with the latent vector;
- ``vector``: an N-vector drawn from N(0, 1) and softmaxed, concatenated with the latent vector;
  its argmax is the hidden label (``hot=True``: the one-hot vector instead, as in reconstruction);
- ``matrix``: the generation is unconditioned up to N×N spatial size, then an N×N matrix with
  row c and column c set to one is concatenated as an extra channel;
- ``vector-matrix``: both — the vector early, the matrix at N×N; they carry the same label.

Layout: ``[z, cond] → Linear → (C, s, s) → ConvTranspose(4, 2, 1)×k → resize conv to N×N`` then
``[·, matrix] → ConvTranspose(4, 2, 1)×d → final (transposed) convolution to H×W``, every hidden
layer with batch norm, ReLU and (heavy, as the paper asks) dropout. The output is linear
(``output="linear"``: the reconstruction's pixel loss keeps it in range) or ``"sigmoid"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from exhume.errors import ConfigError

CONDITIONINGS = ("label", "vector", "matrix", "vector-matrix")
OUTPUTS = ("linear", "sigmoid")


@dataclass
class Conditioning:
    """One batch of conditioning: ``labels`` (the hidden labels), ``target`` (the conditioning
    distribution P the classifier output is compared to), and what the generator is fed."""

    labels: torch.Tensor
    target: torch.Tensor
    vector: torch.Tensor | None
    matrix: torch.Tensor | None


def hot_matrix(labels: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, 1, n, n)``: row and column ``labels[b]`` set to one, zeros elsewhere."""
    onehot = F.one_hot(labels.long(), n).float()
    m = onehot[:, :, None] + onehot[:, None, :]
    return m.clamp(max=1.0)[:, None]


def sample_conditioning(kind: str, batch: int, num_classes: int, generator: torch.Generator | None = None,
                        hot: bool = False, labels: torch.Tensor | None = None) -> Conditioning:
    """Draw a batch of conditioning. Hidden labels are uniform unless ``labels`` is given; a soft
    vector's largest logit is swapped onto its label, so its argmax is the label while the
    distribution of its sorted entries stays that of softmax(N(0, I)). ``hot``: one-hot vectors
    instead of softmaxed normal ones."""
    if kind not in CONDITIONINGS:
        raise ConfigError(f"unknown conditioning {kind!r}; known: {', '.join(CONDITIONINGS)}")
    if labels is None:
        labels = torch.randint(0, num_classes, (batch,), generator=generator)
    labels = labels.long()
    onehot = F.one_hot(labels, num_classes).float()
    if kind == "label" or kind == "matrix" or hot:
        target = onehot
    else:
        logits = torch.randn(batch, num_classes, generator=generator)
        # move the largest logit onto the chosen label: argmax(softmax) is then the hidden label
        top = logits.argmax(1)
        rows = torch.arange(batch)
        at_label = logits[rows, labels].clone()
        logits[rows, labels] = logits[rows, top]
        logits[rows, top] = at_label
        target = torch.softmax(logits, 1)
    vector = target if kind in ("vector", "vector-matrix") else None
    matrix = hot_matrix(labels, num_classes) if kind in ("matrix", "vector-matrix") else None
    return Conditioning(labels=labels, target=target, vector=vector, matrix=matrix)


def _block(cin: int, cout: int, dropout: float) -> list[nn.Module]:
    return [nn.ConvTranspose2d(cin, cout, 4, 2, 1), nn.BatchNorm2d(cout), nn.ReLU(), nn.Dropout2d(dropout)]


class ConditionedGenerator(nn.Module):
    def __init__(self, output_shape: tuple[int, int, int], num_classes: int, conditioning: str = "vector-matrix",
                 latent_dim: int = 64, width: int = 64, dropout: float = 0.3, output: str = "linear") -> None:
        super().__init__()
        if conditioning not in CONDITIONINGS:
            raise ConfigError(f"unknown conditioning {conditioning!r}; known: {', '.join(CONDITIONINGS)}")
        if output not in OUTPUTS:
            raise ConfigError(f"unknown generator output {output!r}; known: {', '.join(OUTPUTS)}")
        if len(output_shape) != 3:
            raise ConfigError(f"the generator makes images (C, H, W); got output shape {tuple(output_shape)}")
        if num_classes < 2:
            raise ConfigError(f"the generator needs a classifier with at least 2 classes, got {num_classes}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"generator dropout must be in [0, 1), got {dropout}")
        c_out, h, w = (int(s) for s in output_shape)
        self.output_shape, self.num_classes, self.conditioning = (c_out, h, w), int(num_classes), conditioning
        self.latent_dim, self.output = int(latent_dim), output
        n = self.num_classes
        self.embed = nn.Embedding(n, n) if conditioning == "label" else None
        cond_dim = n if conditioning in ("label", "vector", "vector-matrix") else 0
        # stage 1 (before the matrix): start at 4×4 (or smaller) and double up to <= N, then resize to N×N
        s0 = min(4, n)
        ups1 = max(0, int(math.floor(math.log2(n / s0))))
        ch1 = width * 2 ** ups1
        self.fc = nn.Sequential(nn.Linear(self.latent_dim + cond_dim, ch1 * s0 * s0), nn.BatchNorm1d(ch1 * s0 * s0),
                                nn.ReLU(), nn.Dropout(dropout))
        self.s0, self.ch1 = s0, ch1
        layers: list[nn.Module] = []
        c, s = ch1, s0
        for _ in range(ups1):
            layers += _block(c, max(c // 2, width), dropout)
            c, s = max(c // 2, width), s * 2
        # resize to exactly N×N: a transposed convolution with kernel N - s + 1 (stride 1)
        layers += [nn.ConvTranspose2d(c, width, n - s + 1), nn.BatchNorm2d(width), nn.ReLU(), nn.Dropout2d(dropout)]
        self.stage1 = nn.Sequential(*layers)
        # stage 2 (after the matrix): double while it stays <= H and W, then one exact-size layer
        c = width + (1 if conditioning in ("matrix", "vector-matrix") else 0)
        ups2 = max(0, int(math.floor(math.log2(min(h, w) / n)))) if min(h, w) >= n else 0
        layers = []
        s = n
        for _ in range(ups2):
            layers += _block(c, width, dropout)
            c, s = width, s * 2
        if h >= s and w >= s:
            layers.append(nn.ConvTranspose2d(c, c_out, (h - s + 1, w - s + 1)))
        elif h <= s and w <= s:
            layers.append(nn.Conv2d(c, c_out, (s - h + 1, s - w + 1)))
        else:
            layers += [nn.Upsample(size=(h, w), mode="bilinear", align_corners=False), nn.Conv2d(c, c_out, 3, padding=1)]
        self.stage2 = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        parts = [z]
        if self.conditioning == "label":
            parts.append(self.embed(cond.labels.to(z.device)))
        elif cond.vector is not None and self.conditioning in ("vector", "vector-matrix"):
            parts.append(cond.vector.to(z))
        h = self.fc(torch.cat(parts, 1)).view(z.shape[0], self.ch1, self.s0, self.s0)
        h = self.stage1(h)
        if self.conditioning in ("matrix", "vector-matrix"):
            h = torch.cat([h, cond.matrix.to(h)], 1)
        out = self.stage2(h)
        return torch.sigmoid(out) if self.output == "sigmoid" else out

    def sample(self, batch: int, generator: torch.Generator | None = None, hot: bool = False,
               labels: torch.Tensor | None = None) -> tuple[torch.Tensor, Conditioning]:
        device = next(self.parameters()).device
        cond = sample_conditioning(self.conditioning, batch, self.num_classes, generator, hot, labels)
        z = torch.randn(batch, self.latent_dim, generator=generator).to(device)
        cond = Conditioning(cond.labels.to(device), cond.target.to(device),
                            None if cond.vector is None else cond.vector.to(device),
                            None if cond.matrix is None else cond.matrix.to(device))
        return self(z, cond), cond
