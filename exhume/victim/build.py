"""Build and train a victim on a dataset task: the reproduction side of the papers."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from exhume.data import load_dataset, make_task
from exhume.errors import ConfigError
from exhume.losses import margin
from exhume.models import build_model, parse_arch
from exhume.victim.train import TrainConfig, train_victim
from exhume.victim.victim import Victim, out_features

DEFAULT_LOSS = {"binary": "logistic", "multiclass": "cross-entropy", "regression": "squared"}


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str = "binary") -> float:
    """Classification accuracy, or for regression the fraction within 0.5/(K−1)·2 of the target (rounding to the right class)."""
    with torch.no_grad():
        out = model(x)
        if kind == "regression":
            return float(((out - y).abs() < regression_tolerance(y)).float().mean())
        return float((margin(out, y) > 0).float().mean())


def regression_targets(classes: np.ndarray, num_classes: int) -> torch.Tensor:
    """Regression task on images: the class id mapped linearly onto [−1, 1]."""
    return torch.as_tensor(classes, dtype=torch.float32) / max(num_classes - 1, 1) * 2.0 - 1.0


def regression_tolerance(y: torch.Tensor) -> float:
    levels = torch.unique(y)
    return float((levels[1:] - levels[:-1]).min() / 2) if levels.numel() > 1 else 0.5


def as_regression(task_data, num_classes: int):
    """Turn a multiclass selection into the regression task (targets from the class ids)."""
    task_data.y = regression_targets(task_data.classes, num_classes)
    task_data.task = "regression"
    task_data.spec = {**task_data.spec, "target": "regression", "num_classes": num_classes}
    return task_data


def make_victim(
    data: str = "mnist",
    task: str = "odd-even",
    n: int = 100,
    arch: str | dict[str, Any] = "mlp:256,256;bias=none;init=1e-4",
    train: TrainConfig | None = None,
    seed: int = 0,
    root: str | None = None,
    test_size: int = 1000,
    progress: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Victim:
    """Select ``n`` training images, build the architecture and train it (seeded)."""
    ds = load_dataset(data, root=root)
    regression = task.strip().lower() == "regression"
    task_data = make_task(ds, "multiclass" if regression else task, n, seed=seed)
    n_cls = int(ds.labels.max()) + 1
    if regression:
        task_data = as_regression(task_data, n_cls)
    kind = task_data.task
    train = train or TrainConfig(loss=DEFAULT_LOSS[kind])
    spec = parse_arch(arch) if isinstance(arch, str) else dict(arch)
    if kind == "multiclass" and train.loss == "logistic":
        raise ConfigError("a multiclass task needs loss 'cross-entropy' (or 'squared'), not 'logistic'")
    if kind == "regression" and train.loss != "squared":
        raise ConfigError(f"a regression task needs loss 'squared', not {train.loss!r}")
    if kind == "binary" and train.loss == "cross-entropy":
        raise ConfigError("a binary task (labels ±1, one output) needs loss 'logistic' or 'squared', not 'cross-entropy'")
    num_classes = n_cls if kind == "multiclass" else None
    torch.manual_seed(seed)
    model = build_model(spec, tuple(task_data.x.shape[1:]), out_features(kind, num_classes)).to(device=device, dtype=dtype)
    x, y = task_data.centred.to(device=device, dtype=dtype), task_data.y.to(device)
    if kind in ("binary", "regression"):
        y = y.to(dtype)
    start = time.perf_counter()
    metrics = train_victim(model, x, y, train, progress=progress)
    metrics["train_accuracy"] = accuracy(model, x, y, kind)
    if kind != "regression":
        with torch.no_grad():
            m = margin(model(x), y)
        metrics["margin_min"], metrics["margin_median"] = float(m.min()), float(m.median())
    if test_size > 0:
        from exhume.data import make_pool

        test = make_pool(ds, "multiclass" if regression else task, test_size, exclude=task_data.indices, seed=seed + 12345)
        if regression:
            test = as_regression(test, n_cls)
        metrics["test_accuracy"] = accuracy(model, (test.x - task_data.mean).to(device=device, dtype=dtype),
                                            test.y.to(device=device, dtype=y.dtype), kind)
        metrics["test_size"] = len(test)
    metrics["wall_seconds"] = round(time.perf_counter() - start, 3)
    model = model.cpu().float().eval()
    return Victim(
        model=model,
        task=kind,
        input_shape=tuple(task_data.x.shape[1:]),
        mean=task_data.mean,
        loss=train.loss,
        weight_decay=train.weight_decay or None,
        num_classes=num_classes,
        arch=spec,
        train_config={**train.to_dict(), "seed": seed, "dtype": str(dtype).replace("torch.", "")},
        metrics=metrics,
        data_spec=task_data.spec,
        train_indices=np.asarray(task_data.indices),
    )
