"""The practitioner zoo's model classes: plain ``nn.Module``s as a user writes them.

PyTorch's default initialisation, biases everywhere, ``forward`` on image batches ``(N, C, H, W)``
(what ``exhume audit`` requires). This file is copied next to every victim's weights, so each
victim folder is self-contained (``model = "models.py:Class"`` in its ``audit.toml``). It imports
torch only.
"""

from __future__ import annotations

from torch import nn


class Net(nn.Module):
    """The README's "Audit your own model" class, unchanged: a 784-300-100-1 MLP with biases."""

    def __init__(self, hidden: int = 300, second: int = 100):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(),
                                  nn.Linear(hidden, second), nn.ReLU(), nn.Linear(second, 1))

    def forward(self, x):
        return self.body(x)


class MLP(nn.Module):
    """Flatten, then ``Linear``+``ReLU`` for each hidden width, then a ``Linear`` to ``outputs`` logits.

    ``widths=[]`` is a linear model.
    """

    def __init__(self, in_features: int = 784, widths: list[int] = (256, 128), outputs: int = 1):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        d = in_features
        for w in widths:
            layers += [nn.Linear(d, w), nn.ReLU()]
            d = w
        layers.append(nn.Linear(d, outputs))
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


def conv_trunk(channels: int, c1: int, c2: int, batchnorm: bool = False) -> nn.Sequential:
    """Two 3×3 convolutions (padding 1), each followed by ReLU and 2×2 max-pooling; optionally BatchNorm."""
    layers: list[nn.Module] = []
    for cin, cout in ((channels, c1), (c1, c2)):
        layers.append(nn.Conv2d(cin, cout, 3, padding=1))
        if batchnorm:
            layers.append(nn.BatchNorm2d(cout))
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
    layers.append(nn.Flatten())
    return nn.Sequential(*layers)


class CNN(nn.Module):
    """The two-conv CNN of the tutorials: conv-ReLU-pool twice, then a hidden ``Linear`` layer and the logits."""

    def __init__(self, channels: int = 1, size: int = 28, c1: int = 8, c2: int = 16, hidden: int = 64,
                 outputs: int = 10, batchnorm: bool = False):
        super().__init__()
        self.features = conv_trunk(channels, c1, c2, batchnorm)
        flat = c2 * (size // 4) ** 2
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, outputs))

    def forward(self, x):
        return self.classifier(self.features(x))


class BNCNN(CNN):
    """The two-conv CNN with ``BatchNorm2d`` after each convolution (trained in training mode, audited in eval mode)."""

    def __init__(self, channels: int = 1, size: int = 28, c1: int = 8, c2: int = 16, hidden: int = 64, outputs: int = 10):
        super().__init__(channels, size, c1, c2, hidden, outputs, batchnorm=True)


class FrozenTrunkHead(nn.Module):
    """A feature extractor and a head trained on its features.

    The trunk is a pre-trained :class:`CNN`'s convolutional part (its ``c2·(size/4)²`` pooled
    features), with its hidden ``Linear`` layer as well when ``hidden > 0``; its parameters are
    frozen in training (``requires_grad = False``, set by the training script). ``head_hidden=0``:
    a linear head.
    """

    def __init__(self, channels: int = 1, size: int = 28, c1: int = 8, c2: int = 16, hidden: int = 0,
                 head_hidden: int = 64, outputs: int = 1):
        super().__init__()
        d = c2 * (size // 4) ** 2
        trunk: list[nn.Module] = [conv_trunk(channels, c1, c2)]
        if hidden:
            trunk += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        self.trunk = nn.Sequential(*trunk)
        head: list[nn.Module] = [nn.Linear(d, head_hidden), nn.ReLU(), nn.Linear(head_hidden, outputs)] if head_hidden \
            else [nn.Linear(d, outputs)]
        self.head = nn.Sequential(*head)

    def forward(self, x):
        return self.head(self.trunk(x))
