"""The weights training started from, and the training settings an owner may know: part of the attacker's view.

A fine-tuned model's start is the public checkpoint it was fine-tuned from; an owner auditing a
model before release can keep its initial weights (or the seed that drew them). With the start
known, what training *added*, ``θ_T − c·θ_0``, is a sum of per-sample gradients along the
trajectory, an equation that holds after any number of steps (:mod:`exhume.equations.trajectory`).

- :func:`check_start`: a dict ``name → tensor`` checked against a module: every key a parameter
  (or buffer) of the module, of the parameter's shape, finite; one line naming the first defect.
  Buffers are accepted and dropped (the equation is about parameters). A start may cover only
  some parameters (``partial=True``); the others are *start unknown*.
- :func:`load_start`: the same from a ``.safetensors`` file or a ``torch.save`` state dict read
  with ``weights_only=True`` (never unpickled).
- :func:`frozen_names`: parameters bit-equal to their start were not trained (a frozen feature
  extractor): the equation leaves them out.
- :class:`TrainingSettings`: optimiser, learning rate, momentum or betas, weight decay, steps (or
  epochs and batch size), optionally Adam's second moment; :meth:`TrainingSettings.decay` is the
  factor ``c`` by which training shrank the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exhume.choices import TRAINING_OPTIMIZERS
from exhume.equations.recipe import SAMPLERS, steps_per_epoch
from exhume.errors import ConfigError, VictimError
from exhume.files.weights import read_tensors
from exhume.starts import frozen_names, start_digest  # noqa: F401  (the victim room's names for them)

SETTING_KEYS = ("optimizer", "lr", "momentum", "betas", "eps", "weight_decay", "steps", "epochs", "batch_size", "adam_step",
                "sampler", "seed", "nesterov", "drop_last")
#: torch's defaults, filled in where a setting is not stated (TrainingSettings.given keeps which were)
DEFAULTS: dict[str, Any] = {"momentum": 0.0, "betas": (0.9, 0.999), "eps": 1e-8, "nesterov": False, "drop_last": False}

def _aligned(start: dict[str, torch.Tensor], names: set[str], prefix: str) -> dict[str, torch.Tensor]:
    """``start`` keyed like ``names``: a wrapper's parameters carry ``prefix`` (e.g. ``model.``), the user's file does not."""
    if prefix and start and not set(start) & names and {prefix + k for k in start} & names:
        return {prefix + k: v for k, v in start.items()}
    return start


def check_start(start: Any, model: nn.Module, source: str = "the start", partial: bool = False) -> dict[str, torch.Tensor]:
    """``start`` checked against ``model``'s parameters: ``{name: tensor}`` of its parameters only (see the module docstring)."""
    if not isinstance(start, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in start.items()):
        raise ConfigError(f"{source} must be a dict of parameter names to tensors (a state dict), got {type(start).__name__}")
    params = dict(model.named_parameters())
    buffers = {k for k, _ in model.named_buffers()}
    prefix = "model." if hasattr(model, "positive") and hasattr(model, "head") else ""  # exhume.victim.wrap.Audited
    start = _aligned(start, set(params) | buffers, prefix)

    def name(k: str) -> str:  # the user's names, without the wrapper's prefix, in what is said
        return k[len(prefix):] if prefix and k.startswith(prefix) else k

    owner = type(getattr(model, "model", model)).__name__ if prefix else type(model).__name__
    known = [k for k in start if k in params]
    if start and not known and not set(start) & buffers:
        raise VictimError(f"{source} is for another model: none of its {len(start)} names (e.g. {name(sorted(start)[0])!r}) is a "
                          f"parameter of {owner} (e.g. {name(next(iter(params), '-'))!r})")
    for k in start:
        if k not in params and k not in buffers:
            raise VictimError(f"{source}: {name(k)!r} is not a parameter of {owner}; expected a state dict of this model")
    for k in known:
        if tuple(start[k].shape) != tuple(params[k].shape):
            raise VictimError(f"{source}: {name(k)} has shape {tuple(start[k].shape)}, the model's is {tuple(params[k].shape)}")
        if not torch.isfinite(start[k]).all():
            raise VictimError(f"{source}: {name(k)} holds {int((~torch.isfinite(start[k])).sum())} NaN/inf values; expected finite weights")
    missing = [k for k in params if k not in start]
    if missing and not partial:
        raise VictimError(f"{source} lacks parameter {name(missing[0])!r} ({len(missing)} of {len(params)} missing); expected a state "
                          "dict of this model, or pass a partial start (--start-partial) if it covers only some parameters")
    if not known:
        raise VictimError(f"{source} holds none of the model's parameters; expected a state dict of this model")
    return {k: start[k].detach().to(params[k].dtype).cpu().clone() for k in params if k in start}


def load_start(path: str | Path, model: nn.Module, partial: bool = False) -> dict[str, torch.Tensor]:
    """The start in file ``path`` (safetensors or a torch state dict, never unpickled), checked against ``model``."""
    return check_start(read_tensors(path, "start weights file"), model, f"start weights file {path}", partial)


@dataclass
class TrainingSettings:
    """How the owner trained from the start, as far as they know it (every field optional).

    ``optimizer``: ``sgd`` (PyTorch's, weight decay added to the gradient), ``adam`` (likewise) or
    ``adamw`` (decoupled decay); ``lr``; ``momentum`` (SGD); ``betas`` and ``eps`` (Adam);
    ``weight_decay``; ``steps``, or ``epochs`` with ``batch_size`` (steps = epochs × ⌈n/batch⌉,
    ``n`` the training-set size); ``second_moment``: Adam's ``exp_avg_sq`` per parameter name at
    the end of training, with ``adam_step`` (its step count, for the bias correction). The exact
    run (:mod:`exhume.equations.recipe`) also needs ``sampler`` (``random``: ``DataLoader(shuffle=True,
    generator=torch.Generator().manual_seed(seed))``; ``sequential``), ``seed``, and takes ``nesterov``
    and ``drop_last``. ``momentum``, ``betas`` and ``eps`` default to torch's (0, (0.9, 0.999), 1e-8);
    ``given`` records which settings were stated (betas stated for SGD is inconsistent).
    """

    optimizer: str | None = None
    lr: float | None = None
    momentum: float | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    steps: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    second_moment: dict[str, torch.Tensor] | None = None
    adam_step: int | None = None
    sampler: str | None = None
    seed: int | None = None
    nesterov: bool | None = None
    drop_last: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
    given: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        stated = tuple(k for k in SETTING_KEYS if getattr(self, k) is not None and not (self.given and k in DEFAULTS))
        self.given = tuple(dict.fromkeys(self.given + stated))  # (a dataclasses.replace keeps which defaults were stated)
        for k, v in DEFAULTS.items():
            if getattr(self, k) is None:
                setattr(self, k, v)
        check_settings(self)

    def total_steps(self, n: int | None) -> int | None:
        """The optimiser steps taken: ``steps``, or ``epochs × ⌈n / batch_size⌉`` (None when unknown)."""
        if self.steps is not None:
            return int(self.steps)
        if self.epochs is not None and self.batch_size is not None and n:
            return int(self.epochs) * steps_per_epoch(int(n), int(self.batch_size), bool(self.drop_last))
        return None

    def decay(self, n: int | None) -> float | None:
        """``c`` in ``θ_T = c·θ_0 + (what the data added)``: the start's share left by weight decay, or None when unknown.

        SGD: the homogeneous part of ``v ← μv + wθ, θ ← θ − ηv`` after ``T`` steps (``c = 1`` without
        weight decay); AdamW: ``(1 − ηw)^T``; Adam's coupled decay is preconditioned per element,
        so its ``c`` is not one number (None: fitted).
        """
        wd = self.weight_decay
        if self.optimizer is None or wd is None:
            return None
        if wd == 0:
            return 1.0
        steps = self.total_steps(n)
        if steps is None or self.lr is None or self.optimizer == "adam":
            return None
        if self.optimizer == "adamw":
            return float((1.0 - self.lr * wd) ** steps)
        step = torch.tensor([[self.momentum, wd], [-self.lr * self.momentum, 1.0 - self.lr * wd]], dtype=torch.float64)
        return float((torch.linalg.matrix_power(step, steps) @ torch.tensor([0.0, 1.0], dtype=torch.float64))[1])

    def record(self) -> dict[str, Any]:
        """The settings as JSON-able values (the second moment by its parameter count only)."""
        out = {k: getattr(self, k) for k in SETTING_KEYS}
        out["betas"] = list(self.betas)
        out["second_moment"] = None if self.second_moment is None else f"{len(self.second_moment)} parameter tensors"
        return out


def _number(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False, integer: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
    if ok and integer:
        ok = float(value) == int(value)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
        raise ConfigError(f"training setting {name} must be {'an integer' if integer else 'a finite number'} {bound}, got {value!r}")


def check_settings(s: TrainingSettings) -> None:
    """One :class:`ConfigError` per bad training setting."""
    if s.optimizer is not None and s.optimizer not in TRAINING_OPTIMIZERS:
        raise ConfigError(f"training setting optimizer must be one of {', '.join(TRAINING_OPTIMIZERS)}, got {s.optimizer!r}")
    checks = (("lr", s.lr, 0.0, None, True, False), ("momentum", s.momentum, 0.0, 1.0, False, False),
              ("eps", s.eps, 0.0, None, False, False), ("weight_decay", s.weight_decay, 0.0, None, False, False),
              ("steps", s.steps, 1, None, False, True), ("epochs", s.epochs, 1, None, False, True),
              ("batch_size", s.batch_size, 1, None, False, True), ("adam_step", s.adam_step, 1, None, False, True))
    for name, value, low, high, low_open, integer in checks:
        if value is not None:
            _number(name, value, low, high, low_open, integer)
    if not (isinstance(s.betas, (tuple, list)) and len(s.betas) == 2):
        raise ConfigError(f"training setting betas must be two numbers in [0, 1), got {s.betas!r}")
    for i, b in enumerate(s.betas):
        _number(f"betas[{i}]", b, 0.0, 1.0)
    s.betas = (float(s.betas[0]), float(s.betas[1]))
    if s.sampler not in (None, *SAMPLERS):
        raise ConfigError(f"training setting sampler must be one of {', '.join(SAMPLERS)}, got {s.sampler!r}")
    if s.seed is not None and not (isinstance(s.seed, int) and not isinstance(s.seed, bool) and 0 <= s.seed < 2**63):
        raise ConfigError(f"training setting seed must be an integer >= 0 (torch.Generator().manual_seed's), got {s.seed!r}")
    for name in ("nesterov", "drop_last"):
        if not isinstance(getattr(s, name), bool):
            raise ConfigError(f"training setting {name} must be true or false, got {getattr(s, name)!r}")
    if s.second_moment is not None:
        if not isinstance(s.second_moment, dict) or not all(isinstance(v, torch.Tensor) for v in s.second_moment.values()):
            raise ConfigError("training setting second_moment must be a dict of parameter names to tensors (Adam's exp_avg_sq)")
        for k, v in s.second_moment.items():
            if not (torch.isfinite(v).all() and (v >= 0).all()):
                raise ConfigError(f"training setting second_moment: {k} must be finite and >= 0 (Adam's exp_avg_sq)")




def training_settings(value: Any) -> TrainingSettings | None:
    """``value`` as :class:`TrainingSettings`: None, an instance, or a dict of its fields (unknown keys refused)."""
    if value is None or isinstance(value, TrainingSettings):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"training must be a dict of training settings ({', '.join(SETTING_KEYS)}), got {type(value).__name__}")
    unknown = sorted(set(value) - set(SETTING_KEYS) - {"second_moment"})
    if unknown:
        raise ConfigError(f"unknown training setting(s) {', '.join(unknown)}; known: {', '.join(SETTING_KEYS)}, second_moment")
    return TrainingSettings(**value)


def load_second_moment(path: str | Path, model: nn.Module) -> tuple[dict[str, torch.Tensor], int | None]:
    """Adam's ``exp_avg_sq`` by parameter name, and its step count, from a file.

    Two layouts: tensors keyed by parameter name (or ``exp_avg_sq.<parameter name>``; an optional
    scalar ``step``), or ``torch.save(optimizer.state_dict())`` of an optimiser built on every parameter of the model
    in order (its state is keyed by position). Read with safetensors or ``weights_only=True``.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        raw = read_tensors(path, "optimizer state file")
    else:
        from exhume.files.torchfile import load_torch

        raw = load_torch(path, "cannot read the optimizer state", "torch.save file")
    if isinstance(raw, dict) and isinstance(raw.get("state"), dict) and "param_groups" in raw:
        return _from_state_dict(raw, model, path)
    names = {k for k, _ in model.named_parameters()}
    prefixed = isinstance(raw, dict) and any(isinstance(k, str) and k.startswith("exp_avg_sq.") for k in raw)
    if not isinstance(raw, dict) or not (prefixed or set(raw) - {"step"} <= names | {n.partition(".")[2] for n in names}):
        raise VictimError(f"optimizer state file {path}: expected Adam's exp_avg_sq keyed by parameter name (optionally "
                          "exp_avg_sq.<name>, and step), or torch.save(optimizer.state_dict())")
    step = raw.get("step")
    moment = {k[len("exp_avg_sq."):] if prefixed else k: v for k, v in raw.items() if k != "step" and (k.startswith("exp_avg_sq.") or not prefixed)}
    moment = check_start(moment, model, f"optimizer state file {path}", partial=True)
    return moment, None if step is None else int(torch.as_tensor(step).reshape(-1)[0])


def _from_state_dict(raw: dict, model: nn.Module, path: Path) -> tuple[dict[str, torch.Tensor], int | None]:
    params = list(model.named_parameters())
    ids = [i for g in raw["param_groups"] for i in g.get("params", [])]
    if len(ids) != len(params):
        raise VictimError(f"optimizer state file {path}: its optimiser held {len(ids)} parameters, the model has {len(params)}; "
                          "the positions cannot be matched to names: save {'exp_avg_sq.' + name: tensor} instead")
    moment, step = {}, None
    for i, (name, _) in zip(ids, params):
        entry = raw["state"].get(i)
        if isinstance(entry, dict) and isinstance(entry.get("exp_avg_sq"), torch.Tensor):
            moment[name] = entry["exp_avg_sq"]
            step = step if step is not None or entry.get("step") is None else int(torch.as_tensor(entry["step"]).reshape(-1)[0])
    if not moment:
        raise VictimError(f"optimizer state file {path} holds no exp_avg_sq: expected an Adam or AdamW optimiser's state")
    return check_start(moment, model, f"optimizer state file {path}", partial=True), step


def with_optimizer_state(training: dict[str, Any], path: str | Path | None, model: nn.Module) -> dict[str, Any]:
    """``training`` with Adam's second moment (and its step count, unless given) read from ``path`` (None: as is)."""
    if path is None:
        return training
    moment, step = load_second_moment(path, model)
    return {**training, "second_moment": moment, **({"adam_step": step} if step is not None and "adam_step" not in training else {})}

