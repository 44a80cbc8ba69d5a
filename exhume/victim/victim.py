"""A victim: a trained model and what an attacker knows about it, saved as a folder.

Folder layout::

    model.safetensors   the trained parameters (never a pickle)
    victim.json         architecture, task, loss, weight decay, input shape, data mean, training
                        settings and metrics, and the data spec (dataset, task, n, seed)
    train_indices.npy   the indices of the training images in their dataset (evaluator-side)
    start.safetensors   the weights training started from, when kept (``exhume train --keep-start``,
                        always for a differentially private victim), for the known-start threat
                        model (``exhume attack --start-weights``)

The attacker's view (:class:`AttackerView`) holds the model, the task, the loss and weight decay
when known, the input shape and the data mean — never the training images or their indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from exhume.data.tasks import TASK_KINDS as TASKS
from exhume.data.tasks import out_features
from exhume.errors import ConfigError, VictimError
from exhume.files.binary import read_npy_indices
from exhume.files.jsonio import write_json
from exhume.files.schemas import read_victim_meta
from exhume.losses import check_loss
from exhume.models import build_model
from exhume.victim.known import Records
from exhume.victim.start import TrainingSettings, check_start, frozen_names, load_start, training_settings
from exhume.victim.wrap import Audited, two_logit_probe

FORMAT_VERSION = 1
#: the files of a victim folder (``victim.json`` written last: a folder holding it is complete)
VICTIM_FILES = ("victim.json", "model.safetensors", "train_indices.npy", "start.safetensors")


@dataclass
class AttackerView:
    """Everything an attack may use: the weights and public facts, never the training set."""

    model: nn.Module
    task: str
    input_shape: tuple[int, ...]
    mean: torch.Tensor  # the data mean the inputs are centred by: one number, one per channel, or (C, H, W)
    loss: str | None = None
    weight_decay: float | None = None
    num_classes: int | None = None
    n_train_hint: int | None = None  # a guess of the training-set size (e.g. from a model card)
    start: dict[str, torch.Tensor] | None = None  # the weights training started from, where known (exhume.victim.start)
    training: TrainingSettings | None = None  # how training ran from the start, as far as the owner knows
    known: Records | None = None  # training records the informed adversary knows (exhume.victim.known)
    candidates: Records | None = None  # k records of which one was trained on: the candidate game (exhume.victim.known)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; known: {', '.join(TASKS)}")
        if self.loss is not None:
            check_loss(self.loss)
        check_finite(self.model)
        self.mean = broadcast_stat(self.mean, tuple(self.input_shape), "the data mean")  # scalar / per channel / image
        if not torch.isfinite(self.mean).all():
            raise VictimError("the victim's data mean holds NaN/inf values; expected finite pixel means")
        if self.task == "binary" and not isinstance(self.model, Audited) and two_logit_probe(self.model, tuple(self.input_shape)):
            # two logits (cross-entropy): margin = logit[1] - logit[0], whose logistic loss is that cross-entropy
            self.model = Audited(self.model, torch.ones(()), "two-logit", positive=1)
            self.loss = "logistic" if self.loss == "cross-entropy" else self.loss
        self.training = training_settings(self.training)
        if self.training is not None and self.training.second_moment is not None:
            self.training.second_moment = check_start(self.training.second_moment, self.model, "training setting second_moment",
                                                      partial=True)
        for name in ("known", "candidates"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Records):
                raise ConfigError(f"{name} must be exhume.victim.known.Records (exhume.request.view_of makes them), "
                                  f"got {type(getattr(self, name)).__name__}")
        if self.start is not None:
            self.start = check_start(self.start, self.model, partial=True)
            trained = [k for k, _ in self.model.named_parameters()]
            if len(self.start) == len(trained) and len(frozen_names(self.model, self.start)) == len(trained):
                raise VictimError("the start equals the trained weights in every parameter: nothing was trained from it "
                                  "(is it the same file as the weights?)")

    @property
    def threat_model(self) -> str:
        """What the attacker knows, in words (recorded with every reconstruction)."""
        words = "the attacker knows the starting weights" if self.start is not None else "weights only"
        if self.known is not None:
            words += f"; informed: {len(self.known)} training records known"
        if self.candidates is not None:
            words += f"; the candidate game: {len(self.candidates)} candidates, one trained on"
        return words


def broadcast_stat(value, input_shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A scalar, per-channel ``(C,)`` or full ``(C, H, W)`` statistic as a ``(C, H, W)`` tensor."""
    t = torch.as_tensor(value, dtype=torch.float32)
    c = input_shape[0]
    if t.numel() == 1:
        return t.reshape(()).expand(input_shape).clone()
    if t.dim() == 1 and t.numel() == c:
        return t.reshape(c, *([1] * (len(input_shape) - 1))).expand(input_shape).clone()
    if t.numel() == math.prod(input_shape):
        return t.reshape(input_shape).clone()
    raise ConfigError(f"{what} has {t.numel()} values (shape {tuple(t.shape)}); expected one number, one per channel "
                      f"({c}), or a full input {tuple(input_shape)}")


def check_finite(model: nn.Module, source: str = "the model") -> None:
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            bad = int((~torch.isfinite(p)).sum())
            raise VictimError(f"{source}: parameter {name!r} has {bad} NaN/inf values; expected finite weights")


@dataclass
class Victim:
    model: nn.Module
    task: str
    input_shape: tuple[int, ...]
    mean: torch.Tensor
    loss: str | None = None
    weight_decay: float | None = None
    num_classes: int | None = None
    arch: dict[str, Any] | None = None
    train_config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    data_spec: dict[str, Any] | None = None
    train_indices: np.ndarray | None = None
    path: Path | None = None
    start: dict[str, torch.Tensor] | None = None  # the weights training started from, when kept (exhume.victim.start)

    @property
    def privacy(self) -> dict[str, Any] | None:
        """What differentially private training recorded (:mod:`exhume.victim.private`), or None."""
        dp = self.train_config.get("dp")
        return dp if isinstance(dp, dict) else None

    def attacker_view(self) -> AttackerView:
        return AttackerView(
            model=self.model,
            task=self.task,
            input_shape=tuple(self.input_shape),
            mean=self.mean,
            loss=self.loss,
            weight_decay=self.weight_decay,
            num_classes=self.num_classes,
            n_train_hint=None if self.train_indices is None else int(len(self.train_indices)),
        )

    @property
    def train_set(self):
        """The training set, rebuilt from the data spec (evaluator-side only)."""
        return self.load_train_set()

    def load_train_set(self, ds=None):
        """:attr:`train_set`, from ``ds`` (the already-loaded ``dataset_of(victim.data_spec)``) if given."""
        from exhume.data import rebuild_task

        if self.data_spec is None:
            raise VictimError(f"victim {self.path or ''} has no data spec: its training set cannot be rebuilt")
        task = rebuild_task(self.data_spec, ds)  # regression victims included (data.tasks knows the kinds)
        if self.train_indices is None:
            raise VictimError(f"victim {self.path or ''} has a data spec but no train_indices.npy, so the rebuilt training set "
                              "cannot be checked against the one it was trained on; for a model trained outside exhume, "
                              "use 'exhume audit' (or exhume.evaluate(recon, train=(x, y), unseen=x_unseen)) with its own images")
        if not np.array_equal(np.sort(task.indices), np.sort(self.train_indices)):
            raise VictimError("the training set rebuilt from the data spec does not match the saved training indices "
                              "(train_indices.npy); refusing to evaluate against other images")
        from dataclasses import replace

        return replace(task, mean=self.mean)  # centred as the victim saw it (a private victim's mean is public)

    def save(self, folder: str | Path) -> Path:
        if self.arch is None:
            raise VictimError("only victims built from an exhume architecture spec can be saved as a folder")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        tensors["__data_mean__"] = self.mean.detach().cpu().float().contiguous()
        save_file(tensors, str(folder / "model.safetensors"))
        meta = {
            "format_version": FORMAT_VERSION,
            "arch": self.arch,
            "task": self.task,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "loss": self.loss,
            "weight_decay": self.weight_decay,
            "objective": "mean_i loss_i + (weight_decay / 2) * ||theta||^2",
            "train_config": self.train_config,
            "metrics": self.metrics,
            "data_spec": self.data_spec,
        }
        if self.train_indices is not None:
            import io

            from exhume.files.jsonio import atomic_write

            buffer = io.BytesIO()
            np.save(buffer, np.asarray(self.train_indices, dtype=np.int64))
            atomic_write(folder / "train_indices.npy", buffer.getvalue())
        if self.start is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.start.items()}, str(folder / "start.safetensors"))
        else:
            (folder / "start.safetensors").unlink(missing_ok=True)  # no stale start from an earlier victim in this folder
        write_json(folder / "victim.json", meta, default=_json_default)  # last: a folder with victim.json is complete
        self.path = folder
        return folder


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_victim(folder: str | Path) -> Victim:
    folder = Path(folder)
    if not folder.exists():
        raise VictimError(f"victim folder {folder} does not exist; expected a folder written by 'exhume train' "
                          "(for a model you trained yourself, use 'exhume audit --model FILE.py:Class --weights ...')")
    meta_path, weights_path = folder / "victim.json", folder / "model.safetensors"
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise VictimError(f"{p} is missing; a victim folder holds victim.json and model.safetensors "
                              "(for a model you trained yourself, use 'exhume audit')")
    meta = read_victim_meta(meta_path)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise VictimError(f"{weights_path} is not a readable safetensors file ({e}); is it truncated?") from None
    task = meta["task"]
    input_shape = tuple(meta["input_shape"])
    try:
        model = build_model(meta["arch"], input_shape, out_features(task, meta.get("num_classes")))
    except ConfigError as e:
        raise VictimError(f"{meta_path}: field 'arch': {e}") from None
    mean = tensors.pop("__data_mean__", torch.zeros(input_shape))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise VictimError(f"{weights_path} does not fit the architecture in victim.json: missing {missing}, unexpected {extra}")
    for k, v in expected.items():
        if tuple(v.shape) != tuple(tensors[k].shape):
            raise VictimError(f"{weights_path}: {k} has shape {tuple(tensors[k].shape)}, the architecture expects {tuple(v.shape)}")
    model.load_state_dict(tensors)
    check_finite(model, str(weights_path))
    if tuple(mean.shape) != input_shape or math.prod(mean.shape) == 0:
        raise VictimError(f"{weights_path}: data mean has shape {tuple(mean.shape)}, expected {input_shape}")
    if not torch.isfinite(mean).all():
        raise VictimError(f"{weights_path}: the data mean (__data_mean__) holds NaN/inf values; expected finite pixel means")
    idx_path, start_path = folder / "train_indices.npy", folder / "start.safetensors"
    indices = read_npy_indices(idx_path, VictimError) if idx_path.is_file() else None
    start = load_start(start_path, model) if start_path.is_file() else None
    return Victim(
        model=model.eval(),
        task=task,
        input_shape=input_shape,
        mean=mean.float(),
        loss=meta.get("loss"),
        weight_decay=meta.get("weight_decay"),
        num_classes=meta.get("num_classes"),
        arch=meta["arch"],
        train_config=meta.get("train_config", {}),
        metrics=meta.get("metrics", {}),
        data_spec=meta.get("data_spec"),
        train_indices=indices,
        path=folder,
        start=start,
    )
