"""Ordinary mini-batch training of a classifier victim (the TLDR paper's CNNs).

Unlike :func:`exhume.victim.train_victim` (full-batch gradient descent towards a stationary
point, as the stationarity attacks assume), this trains the way a practitioner does: shuffled
mini-batches, SGD with momentum or Adam, cross-entropy, optional weight decay, the model in
``.train()`` mode (dropout on, batch norm on batch statistics). The objective per batch is
``mean_batch loss + (weight_decay / 2)·‖θ‖²`` (decay on every parameter, as in
:class:`~exhume.victim.TrainConfig`). The finished model is put in ``.eval()`` mode: that is the
model that is saved and attacked.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from exhume.choices import STEP_OPTIMIZERS
from exhume.errors import DivergenceError
from exhume.files.fields import check_setting
from exhume.losses import margin, per_sample_loss
from exhume.progress import Progress
from exhume.victim.train import check_training


@dataclass
class MiniBatchConfig:
    loss: str = "cross-entropy"
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9  # sgd only
    batch_size: int = 64
    epochs: int = 10
    weight_decay: float = 0.0
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse (one line) a setting that is not finite or out of range; run again by :func:`exhume.victim.make_victim`."""
        check_training(self.loss, self.optimizer, STEP_OPTIMIZERS, self.lr, self.weight_decay, what="mini-batch optimizer",
                       max_seconds=self.max_seconds)
        check_setting("momentum", self.momentum, low=0.0, high=1.0)
        check_setting("batch_size", self.batch_size, integer=True, low=1)
        check_setting("epochs", self.epochs, integer=True, low=1)

    def to_dict(self) -> dict[str, Any]:
        return {"trainer": "minibatch", **asdict(self)}


def train_minibatch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: MiniBatchConfig, seed: int = 0,
                    progress: bool = True) -> dict[str, Any]:
    """Train ``model`` in place on centred inputs ``x``; returns metrics. Leaves it in eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
    else:
        opt = torch.optim.Adam(params, lr=config.lr)
    n = x.shape[0]
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    history: list[tuple[int, float]] = []
    stop_reason = "epochs"
    bar = Progress("train victim", config.epochs, config.max_seconds, unit="ep", disable=not progress)
    epoch = 0
    model.train()
    try:
        for epoch in range(1, config.epochs + 1):
            order = torch.as_tensor(rng.permutation(n))
            total = 0.0
            for i in range(0, n, config.batch_size):
                idx = order[i:i + config.batch_size]
                if len(idx) < 2 and n >= 2:  # batch norm needs two samples in training mode
                    continue
                loss = per_sample_loss(config.loss, model(x[idx]), y[idx]).mean()
                obj = loss + 0.5 * config.weight_decay * sum((p ** 2).sum() for p in params) if config.weight_decay > 0 else loss
                opt.zero_grad(set_to_none=True)
                obj.backward()
                opt.step()
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise DivergenceError(f"training diverged at epoch {epoch}; lower the learning rate (lr={config.lr})")
                total += value * len(idx)
            history.append((epoch, total / n))
            bar.update(epoch, loss=f"{total / n:.3g}")
            if config.max_seconds is not None and time.perf_counter() - start > config.max_seconds:
                stop_reason = "max_seconds"
                break
    finally:
        bar.close()
        model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i:i + 1000]) for i in range(0, n, 1000)])
        final = float(per_sample_loss(config.loss, out, y).mean())
        acc = float((margin(out, y) > 0).float().mean())
    return {"epochs": epoch, "seconds": round(time.perf_counter() - start, 3), "stop_reason": stop_reason,
            "final_loss": final, "train_accuracy": acc, "loss_history": history, "stationarity_residual": None}
