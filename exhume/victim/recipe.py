"""The paper victim's recipe, defined once (used by ``exhume train``'s defaults, the demo, the kkt
experiments and :func:`exhume.victim.make_victim`).

Haim et al.'s (2022) victim at CPU scale: a bias-free ReLU MLP with two hidden layers (256
wide here, 1000 in the paper), first layer initialised N(0,1)·1e-4, trained full-batch with
gradient descent (lr 0.2) on the logistic loss, with Buzaglo et al.'s (2023) weight decay 5e-3.
"""

from __future__ import annotations

from typing import Any

PAPER_ARCH = "mlp:256,256;bias=none;init=1e-4"
#: The paper victim's architecture with the paper's widths (for ``--full`` runs on a GPU).
PAPER_ARCH_FULL = "mlp:1000,1000;bias=first;init=1e-4"
PAPER_TRAIN: dict[str, Any] = {"optimizer": "gd", "lr": 0.2, "weight_decay": 5e-3}
