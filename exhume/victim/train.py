"""Training victims the way the papers do: full-batch gradient descent to (near) stationarity."""

from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from exhume.choices import FULL_BATCH_OPTIMIZERS
from exhume.equations.span import span_gap
from exhume.errors import ConfigError, DivergenceError, ExhumeError
from exhume.files.fields import check_setting
from exhume.files.runfolder import tensors_digest
from exhume.interrupts import whole_step
from exhume.losses import check_loss, per_sample_loss
from exhume.losses import relative_objective_gradient as stationarity_residual  # ‖∇ objective‖ / ‖w·θ‖
from exhume.progress import Progress


def check_training(loss: str, optimizer: str, known: tuple[str, ...], lr: float, weight_decay: float, what: str = "optimizer",
                   max_seconds: float | None = None) -> None:
    """The checks every training configuration shares (full-batch and mini-batch): the same field
    checks as the files exhume reads (:func:`exhume.files.fields.check_setting`: finite, in range)."""
    check_loss(loss)
    if optimizer not in known:
        raise ConfigError(f"unknown {what} {optimizer!r}; known: {', '.join(known)}")
    check_setting("lr", lr, positive=True)
    check_setting("weight_decay", weight_decay, low=0.0)
    check_setting("max_seconds", max_seconds, positive=True, optional=True)


@dataclass
class TrainConfig:
    """Full-batch training of a victim.

    The objective is ``mean_i loss_i + (weight_decay / 2) · ‖θ‖²`` (weight decay on every
    parameter, as in the stationarity equation the attack inverts). Training stops at the first
    of: ``max_epochs``, ``max_seconds``, the training loss below ``loss_threshold``, or the
    relative stationarity residual below ``residual_threshold`` (only with weight decay), or every weight layer that
    sees more than ``n`` directions with ``σ_{n+1}/σ_1`` below ``span_threshold``: its spectrum collapsed to the
    training inputs' span (:func:`exhume.equations.span.span_gap`), what a layer above a CNN's convolutions
    shows only near a stationary point, where the residual of a ReLU network may not fall (docs/METHODS.md §1).
    Both are checked every ``log_every`` epochs.
    """

    loss: str = "logistic"
    optimizer: str = "gd"
    lr: float = 0.01
    weight_decay: float = 0.0
    max_epochs: int = 100_000
    max_seconds: float | None = None
    loss_threshold: float | None = None
    residual_threshold: float | None = None
    span_threshold: float | None = None
    log_every: int = 100
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse (one line) a setting that is not finite or out of range; run again by :func:`exhume.victim.make_victim`."""
        check_training(self.loss, self.optimizer, FULL_BATCH_OPTIMIZERS, self.lr, self.weight_decay, max_seconds=self.max_seconds)
        check_setting("max_epochs", self.max_epochs, integer=True, low=1)
        check_setting("loss_threshold", self.loss_threshold, low=0.0, optional=True)
        check_setting("residual_threshold", self.residual_threshold, low=0.0, optional=True)
        check_setting("span_threshold", self.span_threshold, low=0.0, optional=True)
        check_setting("log_every", self.log_every, integer=True, low=1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CHECKPOINT_SECONDS = 60.0


def _training_state(config: TrainConfig, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """What a resumed training must share with its checkpoint (the epoch budget may grow)."""
    return {"loss": config.loss, "optimizer": config.optimizer, "lr": config.lr, "weight_decay": config.weight_decay,
            "data": tensors_digest(x, y)}


def _save_training(path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int, elapsed: float,
                   history: list[tuple[int, float]], same: dict[str, Any]) -> None:
    from exhume.files.torchfile import save_torch

    save_torch(path, {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "optimizer": opt.state_dict(),
                      "epoch": epoch, "elapsed": elapsed, "history": [list(h) for h in history], "settings": same})


def _load_training(path, model: nn.Module, opt: torch.optim.Optimizer, same: dict[str, Any]) -> tuple[int, float, list]:
    """Restore ``model`` and ``opt`` from a training checkpoint; returns ``(epoch, elapsed, history)``."""
    from exhume.files.torchfile import expected_limit, load_torch, state_bytes

    advice = "delete it to train from the start"
    weights = {k: v for k, v in model.state_dict().items()}
    payload = load_torch(path, "cannot resume training", "exhume training checkpoint", advice,
                         limit=expected_limit(state_bytes(weights, {"opt": opt})))
    try:
        epoch, elapsed, history, settings = int(payload["epoch"]), float(payload["elapsed"]), list(payload["history"]), payload["settings"]
        if not isinstance(settings, dict):
            raise TypeError(f"settings is a {type(settings).__name__}, expected a dict")
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ExhumeError(f"cannot resume training from {path}: not a readable exhume training checkpoint "
                          f"(missing or malformed field: {type(e).__name__}: {e}); {advice}") from None
    for key, value in same.items():
        if settings.get(key) != value:
            shown = "other images or labels" if key == "data" else f"{key}={settings.get(key)!r}"
            raise ExhumeError(f"cannot resume training from {path}: it was written with {shown}, this run has "
                              f"{'these' if key == 'data' else f'{key}={value!r}'}; delete it to train from the start")
    if epoch < 0 or not math.isfinite(elapsed) or elapsed < 0:
        raise ExhumeError(f"cannot resume training from {path}: epoch {epoch}, elapsed {elapsed} out of range")
    try:
        model.load_state_dict(payload["model"])
        opt.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise ExhumeError(f"cannot resume training from {path}: it does not fit this model ({str(e).splitlines()[0]})") from None
    return epoch, elapsed, [tuple(h) for h in history]


def _epoch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig, params: list, opt) -> float:
    """One full-batch step; returns the data loss before it."""
    opt.zero_grad(set_to_none=True)
    data_loss = per_sample_loss(config.loss, model(x), y).mean()
    obj = data_loss
    if config.weight_decay > 0:
        obj = obj + 0.5 * config.weight_decay * sum((p**2).sum() for p in params)
    obj.backward()
    opt.step()
    return float(data_loss.detach())


def _stop_reason(model: nn.Module, x, y, config: TrainConfig, epoch: int, value: float, seconds: float) -> str | None:
    if config.loss_threshold is not None and value < config.loss_threshold:
        return "loss_threshold"
    if config.max_seconds is not None and seconds > config.max_seconds:
        return "max_seconds"
    if (config.residual_threshold is not None and config.weight_decay > 0 and epoch % config.log_every == 0
            and stationarity_residual(model, x, y, config.loss, config.weight_decay) < config.residual_threshold):
        return "residual_threshold"
    if config.span_threshold is not None and epoch % config.log_every == 0:
        gap = span_gap(model, x.shape[0])
        if gap is not None and gap < config.span_threshold:
            return "span_threshold"
    return None


def train_victim(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig, progress: bool = True,
                 checkpoint=None, resume: bool = False, checkpoint_seconds: float = CHECKPOINT_SECONDS) -> dict[str, Any]:
    """Train ``model`` in place on centred inputs ``x``; returns training metrics.

    With ``checkpoint`` (a file path), the model, the optimiser state and the progress are written
    there every ``checkpoint_seconds`` of training and when the run is interrupted (Ctrl-C,
    SIGTERM, a chunk's deadline: any KeyboardInterrupt); ``resume=True`` continues from it when it
    exists (same loss, optimiser, learning rate, weight decay and data, else an error). Full-batch
    training is deterministic, so a resumed victim equals one trained without a break;
    ``max_seconds`` counts the training time of every chunk.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=config.lr) if config.optimizer == "gd" else torch.optim.Adam(params, lr=config.lr)
    history: list[tuple[int, float]] = []
    done, elapsed0 = 0, 0.0  # done: the last epoch whose update is complete
    same = _training_state(config, x, y) if checkpoint is not None else {}
    if checkpoint is not None and resume and os.path.isfile(checkpoint):
        done, elapsed0, history = _load_training(checkpoint, model, opt, same)
    first, start, saved_at = done + 1, time.perf_counter() - elapsed0, time.perf_counter()
    stop_reason = "max_epochs"
    bar = Progress("train victim", config.max_epochs, config.max_seconds, unit="ep", disable=not progress)
    try:
        for epoch in range(first, config.max_epochs + 1):
            with whole_step() if checkpoint is not None else nullcontext():  # an interrupt lands before or after the update and its count
                value = _epoch(model, x, y, config, params, opt)
                done = epoch
            if not math.isfinite(value):
                raise DivergenceError(f"training diverged at epoch {epoch} (loss {value}); lower the learning rate (lr={config.lr})")
            logged = epoch % config.log_every == 0 or epoch == 1
            if logged:
                history.append((epoch, value))
            bar.update(epoch, **({"loss": f"{value:.3g}"} if logged else {}))
            if checkpoint is not None and time.perf_counter() - saved_at > checkpoint_seconds:
                _save_training(checkpoint, model, opt, done, time.perf_counter() - start, history, same)
                saved_at = time.perf_counter()
            reason = _stop_reason(model, x, y, config, epoch, value, time.perf_counter() - start)
            if reason is not None:
                stop_reason = reason
                break
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, a chunk's deadline: keep what was trained
        if checkpoint is not None:
            _save_training(checkpoint, model, opt, done, time.perf_counter() - start, history, same)
        raise
    finally:
        bar.close()
    if checkpoint is not None:
        _save_training(checkpoint, model, opt, done, time.perf_counter() - start, history, same)
    with torch.no_grad():
        final_loss = float(per_sample_loss(config.loss, model(x), y).mean())
    residual = stationarity_residual(model, x, y, config.loss, config.weight_decay) if config.weight_decay > 0 else None
    seconds = round(time.perf_counter() - start, 3)
    return {"epochs": done, "seconds": seconds, "stop_reason": stop_reason,
            "stop": stop_record(model, x.shape[0], config, stop_reason, final_loss, residual),
            "final_loss": final_loss, "stationarity_residual": residual, "loss_history": history,
            **({"resumed_from_epoch": first - 1} if first > 1 else {})}


#: each stopping threshold's measure, as the record and the printed line name it
THRESHOLD_MEASURES = {"loss_threshold": "the training loss", "residual_threshold": "the relative stationarity residual",
                      "span_threshold": "σ_{n+1}/σ_1 (the largest over the layers that see more than n directions)"}


def stop_record(model: nn.Module, n: int, config: TrainConfig, reason: str, loss: float, residual: float | None) -> dict[str, Any]:
    """What stopped training, and for each threshold given the value its measure reached at the end (``met``: below it).

    ``{"reason", "max_epochs", "max_seconds", "thresholds": {name: {"threshold", "reached", "met", "measure"}}}``; a
    threshold whose measure was never checked (the residual without weight decay) has ``reached`` None. A run that stopped
    on ``max_seconds`` or ``max_epochs`` with a threshold unmet is one the caller asked to train further than it did.
    """
    given = {k: getattr(config, k) for k in THRESHOLD_MEASURES if getattr(config, k) is not None}
    values = {"loss_threshold": loss, "residual_threshold": residual if config.weight_decay > 0 else None,
              "span_threshold": span_gap(model, n) if "span_threshold" in given else None}
    thresholds = {k: {"threshold": t, "reached": values[k], "met": values[k] is not None and values[k] < t,
                      "measure": THRESHOLD_MEASURES[k]} for k, t in given.items()}
    return {"reason": reason, "max_epochs": config.max_epochs, "max_seconds": config.max_seconds, "thresholds": thresholds}
