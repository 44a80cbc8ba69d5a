"""Training victims the way the papers do: full-batch gradient descent to (near) stationarity."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from exhume.errors import ConfigError, DivergenceError
from exhume.losses import check_loss, per_sample_loss
from exhume.progress import Progress

OPTIMIZERS = ("gd", "adam")


def check_training(loss: str, optimizer: str, known: tuple[str, ...], lr: float, weight_decay: float, what: str = "optimizer") -> None:
    """The checks every training configuration shares (full-batch and mini-batch)."""
    check_loss(loss)
    if optimizer not in known:
        raise ConfigError(f"unknown {what} {optimizer!r}; known: {', '.join(known)}")
    if not lr > 0:
        raise ConfigError(f"lr must be > 0, got {lr}")
    if weight_decay < 0:
        raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")


@dataclass
class TrainConfig:
    """Full-batch training of a victim.

    The objective is ``mean_i loss_i + (weight_decay / 2) · ‖θ‖²`` (weight decay on every
    parameter, as in the stationarity equation the attack inverts). Training stops at the first
    of: ``max_epochs``, ``max_seconds``, the training loss below ``loss_threshold``, or the
    relative stationarity residual below ``residual_threshold`` (only with weight decay).
    """

    loss: str = "logistic"
    optimizer: str = "gd"
    lr: float = 0.01
    weight_decay: float = 0.0
    max_epochs: int = 100_000
    max_seconds: float | None = None
    loss_threshold: float | None = None
    residual_threshold: float | None = None
    log_every: int = 100
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_training(self.loss, self.optimizer, OPTIMIZERS, self.lr, self.weight_decay)
        if self.max_epochs < 1:
            raise ConfigError(f"max_epochs must be >= 1, got {self.max_epochs}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stationarity_residual(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> float:
    """‖∇_θ objective‖ / ‖weight_decay · θ‖: 0 at a stationary point of the regularised objective."""
    params = [p for p in model.parameters() if p.requires_grad]
    obj = per_sample_loss(loss, model(x), y).mean()
    grads = torch.autograd.grad(obj, params)
    num = sum(((g + weight_decay * p) ** 2).sum() for g, p in zip(grads, params)).sqrt()
    den = sum(((weight_decay * p) ** 2).sum() for p in params).sqrt().clamp_min(1e-30)
    return float((num / den).detach())


def train_victim(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``model`` in place on centred inputs ``x``; returns training metrics."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "gd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=config.lr)
    else:
        opt = torch.optim.Adam(params, lr=config.lr)
    history: list[tuple[int, float]] = []
    start = time.perf_counter()
    stop_reason = "max_epochs"
    bar = Progress("train victim", config.max_epochs, config.max_seconds, unit="ep", disable=not progress)
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        opt.zero_grad(set_to_none=True)
        data_loss = per_sample_loss(config.loss, model(x), y).mean()
        obj = data_loss
        if config.weight_decay > 0:
            obj = obj + 0.5 * config.weight_decay * sum((p**2).sum() for p in params)
        obj.backward()
        opt.step()
        value = float(data_loss.detach())
        if not math.isfinite(value):
            bar.close()
            raise DivergenceError(f"training diverged at epoch {epoch} (loss {value}); lower the learning rate (lr={config.lr})")
        if epoch % config.log_every == 0 or epoch == 1:
            history.append((epoch, value))
            bar.update(epoch, loss=f"{value:.3g}")
        else:
            bar.update(epoch)
        if config.loss_threshold is not None and value < config.loss_threshold:
            stop_reason = "loss_threshold"
            break
        if config.max_seconds is not None and time.perf_counter() - start > config.max_seconds:
            stop_reason = "max_seconds"
            break
        if (
            config.residual_threshold is not None
            and config.weight_decay > 0
            and epoch % config.log_every == 0
            and stationarity_residual(model, x, y, config.loss, config.weight_decay) < config.residual_threshold
        ):
            stop_reason = "residual_threshold"
            break
    bar.close()
    with torch.no_grad():
        final_loss = float(per_sample_loss(config.loss, model(x), y).mean())
    residual = stationarity_residual(model, x, y, config.loss, config.weight_decay) if config.weight_decay > 0 else None
    return {
        "epochs": epoch,
        "seconds": round(time.perf_counter() - start, 3),
        "stop_reason": stop_reason,
        "final_loss": final_loss,
        "stationarity_residual": residual,
        "loss_history": history,
    }
