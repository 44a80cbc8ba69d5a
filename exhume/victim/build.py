"""Build and train a victim on a dataset task: the reproduction side of the papers.

One :func:`make_victim` for both trainers: full-batch gradient descent towards a stationary
point (:class:`~exhume.victim.TrainConfig`, the stationarity attacks' setting) or ordinary
mini-batch training (:class:`~exhume.victim.MiniBatchConfig`, the TLDR paper's CNNs). The task
kinds (binary, multiclass, regression) are defined in :mod:`exhume.data.tasks`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exhume.data import load_dataset
from exhume.data.tasks import (  # noqa: F401
    DEFAULT_LOSS,
    TaskData,
    as_regression,
    check_task_loss,
    num_classes_of,
    out_features,
    regression_targets,
    regression_tolerance,
    select_pool,
    select_task,
)
from exhume.errors import ConfigError
from exhume.files.fields import check_setting
from exhume.losses import margin
from exhume.models import build_model, parse_arch
from exhume.victim.minibatch import MiniBatchConfig, train_minibatch
from exhume.victim.private import DPConfig, require_opacus, train_private
from exhume.victim.recipe import PAPER_ARCH
from exhume.victim.train import TrainConfig, train_victim
from exhume.victim.victim import Victim


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str = "binary", batch: int = 1000) -> float:
    """Classification accuracy, or for regression the fraction within half a class gap of the target
    (rounding to the right class); the model sees at most ``batch`` inputs at a time."""
    with torch.no_grad():
        out = torch.cat([model(x[i:i + batch]) for i in range(0, x.shape[0], batch)])
        if kind == "regression":
            return float(((out - y).abs() < regression_tolerance(y)).float().mean())
        return float((margin(out, y) > 0).float().mean())


def _test_accuracy(model, ds, task: str, task_data, test_size: int, exclude, seed: int, label_dtype) -> dict[str, Any]:
    """Accuracy on ``test_size`` images disjoint from the training set (and from ``exclude``)."""
    p = next(model.parameters())
    excl = np.asarray(task_data.indices)
    if exclude is not None:
        excl = np.union1d(excl, np.asarray(exclude))
    test = select_pool(ds, task, test_size, exclude=excl, seed=seed + 12345)
    acc = accuracy(model, (test.x - task_data.mean).to(device=p.device, dtype=p.dtype), test.y.to(device=p.device, dtype=label_dtype),
                   task_data.task)
    return {"test_accuracy": acc, "test_size": len(test)}


def make_victim(
    data: str = "mnist",
    task: str = "odd-even",
    n: int = 100,
    arch: str | dict[str, Any] = PAPER_ARCH,
    train: TrainConfig | MiniBatchConfig | None = None,
    seed: int = 0,
    root: str | None = None,
    test_size: int = 1000,
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    exclude_from_test: np.ndarray | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    private: DPConfig | None = None,
    keep_start: bool = False,
    public_centring: bool = False,
) -> Victim:
    """Select ``n`` training images, build the architecture and train it (seeded).

    ``train``: a :class:`TrainConfig` (full-batch, the default) or a :class:`MiniBatchConfig`. The test images
    (``test_size``) are disjoint from the training set (and from ``exclude_from_test``, e.g. a held-out set the
    evaluator keeps apart). ``checkpoint``: a file that full-batch training writes as it goes
    (:func:`~exhume.victim.train.train_victim`); ``resume=True`` continues from it. ``private``: DP-SGD through
    Opacus (:mod:`exhume.victim.private`, recorded as ``train_config["dp"]``); ``keep_start`` (always with
    ``private``): keep the weights training started from (``victim.start``); ``public_centring`` (always with
    ``private``): inputs centred by :func:`public_mean`."""
    ds = load_dataset(data, root=root)
    task_data = select_task(ds, task, n, seed=seed)
    kind = task_data.task
    train = train or TrainConfig(loss=DEFAULT_LOSS[kind])
    _check_training(train, kind, checkpoint, test_size, private)
    spec = parse_arch(arch) if isinstance(arch, str) else dict(arch)
    num_classes = num_classes_of(ds, task) if kind == "multiclass" else None
    torch.manual_seed(seed)
    model = build_model(spec, tuple(task_data.x.shape[1:]), out_features(kind, num_classes)).to(device=device, dtype=dtype)
    task_data, public = public_mean(ds, task_data, seed) if private is not None or public_centring else (task_data, None)
    x, y = task_data.centred.to(device=device, dtype=dtype), task_data.y.to(device)
    if kind in ("binary", "regression"):
        y = y.to(dtype)
    start_weights = {k: v.detach().cpu().float().clone() for k, v in model.named_parameters()} if keep_start or private else None
    start = time.perf_counter()
    metrics = fit(model, x, y, kind, train, seed, progress, checkpoint=checkpoint, resume=resume, private=private)
    privacy = {**dp, "mean": public} if (dp := metrics.pop("dp", None)) else None
    if test_size > 0:
        metrics.update(_test_accuracy(model, ds, task, task_data, test_size, exclude_from_test, seed, y.dtype))
    metrics["wall_seconds"] = round(time.perf_counter() - start, 3)
    return Victim(
        model=model.cpu().float().eval(), task=kind, input_shape=tuple(task_data.x.shape[1:]), mean=task_data.mean,
        loss=train.loss, weight_decay=train.weight_decay or None, num_classes=num_classes, arch=spec,
        train_config={**train.to_dict(), "seed": seed, "dtype": str(dtype).replace("torch.", ""), **({"dp": privacy} if privacy else {}),
                      **({"centring": public} if public else {})},
        metrics=metrics,
        data_spec=task_data.spec,
        train_indices=np.asarray(task_data.indices),
        start=start_weights,
    )


#: images outside the training set whose mean centres a private victim's inputs
PUBLIC_MEAN_IMAGES = 1000


def public_mean(ds, task_data, seed: int):
    """``(task_data centred by a public mean, its record)``: the mean of :data:`PUBLIC_MEAN_IMAGES` images of the task the
    victim never trains on. The training set's own mean would be released unnoised with the weights (and from it and
    the n − 1 other records the last one exactly): docs/METHODS.md §7."""
    from dataclasses import replace

    from exhume.data.tasks import select_pool

    pool = select_pool(ds, task_data.spec["task"], PUBLIC_MEAN_IMAGES, exclude=np.asarray(task_data.indices), seed=seed + 11)
    return replace(task_data, mean=pool.x.mean(0)), (f"public: the mean of {len(pool)} images of the task outside the training "
                                                      f"set (seed {seed + 11}), not the training set's")


def make_minibatch_victim(data: str = "mnist", task: str = "multiclass", n: int = 1000,
                          arch: str | dict[str, Any] = "convnet:32,64;fc=128;dropout=0.25",
                          train: MiniBatchConfig | None = None, seed: int = 0, root: str | None = None,
                          test_size: int = 1000, progress: bool = True, exclude_from_test: np.ndarray | None = None) -> Victim:
    """:func:`make_victim` with mini-batch training and the TLDR victim's defaults (a convnet on
    1,000 images, multiclass, ``MiniBatchConfig()``)."""
    return make_victim(data, task, n, arch, train or MiniBatchConfig(), seed=seed, root=root, test_size=test_size,
                       progress=progress, exclude_from_test=exclude_from_test)


def _check_training(train: TrainConfig | MiniBatchConfig, kind: str, checkpoint, test_size: int, private=None) -> None:
    check_setting("test_size", test_size, integer=True, low=0)
    if private is not None:
        if not isinstance(private, DPConfig):
            raise ConfigError(f"private must be a DPConfig, got {type(private).__name__}")
        private.validate()
        require_opacus()  # before anything is built: one line naming the extra
        if checkpoint is not None:
            raise ConfigError("differentially private training is not checkpointed (its accountant and noise would restart): "
                              "leave out the training checkpoint")
    if not isinstance(train, (TrainConfig, MiniBatchConfig)):
        raise ConfigError(f"train must be a TrainConfig or a MiniBatchConfig, got {type(train).__name__}")
    train.validate()  # again: a dataclass's fields can be changed after it was built
    check_task_loss(kind, train.loss)
    if isinstance(train, MiniBatchConfig) and checkpoint is not None:
        raise ConfigError("training checkpoints are written by full-batch training (TrainConfig), not mini-batch training")
    if isinstance(train, MiniBatchConfig) and kind == "regression":
        raise ConfigError("mini-batch training handles classification tasks (binary, multiclass), not regression")


def fit(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str, train: TrainConfig | MiniBatchConfig,
        seed: int, progress: bool, checkpoint: str | Path | None = None, resume: bool = False,
        private: DPConfig | None = None) -> dict[str, Any]:
    """Train ``model`` in place with either trainer, privately with ``private``; returns its metrics (accuracy and margins included)."""
    if private is not None:
        metrics = train_private(model, x, y, train, private, seed=seed, progress=progress)
    elif isinstance(train, MiniBatchConfig):
        return train_minibatch(model, x, y, train, seed=seed, progress=progress)
    else:
        metrics = train_victim(model, x, y, train, progress=progress, checkpoint=checkpoint, resume=resume)
    metrics["train_accuracy"] = accuracy(model, x, y, kind)
    if kind != "regression":
        with torch.no_grad():
            m = margin(model(x), y)
        metrics["margin_min"], metrics["margin_median"] = float(m.min()), float(m.median())
    return metrics


__all__ = ["DEFAULT_LOSS", "TaskData", "accuracy", "as_regression", "fit", "make_minibatch_victim", "make_victim", "regression_targets", "regression_tolerance"]
