"""A training run replayed exactly: torch.optim's update rules as functions, and the order a DataLoader visits the data.

Shared by the victim room (which checks an owner's recipe) and the attacks (which replay it on candidates):

- :func:`update`: one step of ``torch.optim.SGD`` (momentum, dampening 0, Nesterov, weight decay added to the
  gradient), ``Adam`` (weight decay added to the gradient) or ``AdamW`` (decoupled: ``θ ← (1 − η·w)·θ`` first),
  written as torch writes them (``_single_tensor_sgd`` / ``_single_tensor_adam``) but out of place, so that
  a run can be differentiated through. Adam's ``√v`` has the derivative ``1/(2·max(√v, eps))`` (torch's is
  unbounded as ``v → 0``; the value is the same).
- :func:`batches`: the training-set indices of every step, drawn by the same ``DataLoader`` the owner
  iterated: sampler ``"random"`` is ``DataLoader(range(n), batch_size, shuffle=True,
  generator=torch.Generator().manual_seed(seed), drop_last)`` made once and iterated once per epoch (so
  each epoch's permutation is drawn from that one generator, as a training loop over one loader draws
  it); ``"sequential"`` is ``shuffle=False``. A loader without its own generator draws from torch's global
  random state, which is not a setting: not covered.
- :func:`check_exact`: the recipe complete and consistent for ``n`` training points, or one
  :class:`~exhume.errors.ConfigError` naming the first missing or inconsistent setting.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from exhume.errors import ConfigError

SAMPLERS = ("random", "sequential")
ADAM_ONLY = ("betas", "eps")
SGD_ONLY = ("momentum", "nesterov")


def init_state(s, theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optimiser's state before the first step, by ``<kind>.<parameter>`` (SGD's momentum buffer is a placeholder there:
    torch starts it as the first step's gradient)."""
    if s.optimizer == "sgd":
        return {f"buf.{k}": torch.zeros_like(v) for k, v in theta.items()} if s.momentum else {}
    return {f"{kind}.{k}": torch.zeros_like(v) for kind in ("m", "v") for k, v in theta.items()}


def _sqrt(v: torch.Tensor, floor: float) -> torch.Tensor:
    """``√v`` in value; its derivative ``1 / (2·max(√v, floor))``: bounded where ``√v`` is below Adam's ``eps``, whose
    step it then hardly changes (the exact derivative there overflowed float32 on an Adam-trained MLP: NaN candidates)."""
    root = v.clamp_min(0).sqrt().detach()
    return root + (v - v.detach()) * (0.5 / root.clamp_min(floor))


def update(s, theta: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
           step: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One optimiser step ``step`` (1-based) with settings ``s`` (optimizer, lr, momentum, nesterov, betas, eps,
    weight_decay): the new parameters and state, out of place (see the module docstring)."""
    lr, wd = float(s.lr), float(s.weight_decay or 0.0)
    new, out = {}, {}
    for k, p in theta.items():
        g = grads[k]
        if s.optimizer == "sgd":
            if wd != 0:
                g = g + wd * p
            if s.momentum:
                buf = g if step == 1 else s.momentum * state[f"buf.{k}"] + g
                out[f"buf.{k}"] = buf
                g = g + s.momentum * buf if getattr(s, "nesterov", False) else buf
            new[k] = p - lr * g
            continue
        if s.optimizer == "adamw":
            p = p * (1 - lr * wd)
        elif wd != 0:
            g = g + wd * p
        b1, b2 = s.betas
        m = state[f"m.{k}"] + (1 - b1) * (g - state[f"m.{k}"])  # torch's lerp
        v = b2 * state[f"v.{k}"] + (1 - b2) * g * g
        out[f"m.{k}"], out[f"v.{k}"] = m, v
        denom = _sqrt(v, s.eps) / math.sqrt(1 - b2 ** step) + s.eps
        new[k] = p - (lr / (1 - b1 ** step)) * m / denom
    return new, out


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches a DataLoader makes of ``n`` points per epoch."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def total_steps(s, n: int) -> int:
    """The optimiser steps of the run: ``steps``, else ``epochs × steps_per_epoch``."""
    if s.steps is not None:
        return int(s.steps)
    return int(s.epochs) * steps_per_epoch(n, int(s.batch_size), bool(getattr(s, "drop_last", False)))


def batches(s, n: int) -> list[torch.Tensor]:
    """The indices (into the ``n`` training points, in their given order) of every step's batch (see the module docstring)."""
    from torch.utils.data import DataLoader

    random = s.sampler == "random"
    loader = DataLoader(torch.arange(n), batch_size=int(s.batch_size), shuffle=random, drop_last=bool(getattr(s, "drop_last", False)),
                        generator=torch.Generator().manual_seed(int(s.seed)) if random else None)
    out: list[torch.Tensor] = []
    want = total_steps(s, n)
    while len(out) < want:
        out.extend(b.clone() for b in loader)
    return out[:want]


def _need(s, name: str, what: str) -> None:
    if getattr(s, name, None) is None:
        raise ConfigError(f"the exact training run needs training setting {name} ({what})")


def check_exact(s, n: int) -> None:
    """Refuse, in one line naming it, the first setting of ``s`` that is missing or inconsistent for ``n`` training points."""
    if s is None:
        raise ConfigError("the exact training run needs the training settings (training={...}: optimizer, lr, weight_decay, "
                          "batch_size, epochs or steps, sampler, seed)")
    given = set(getattr(s, "given", ()))
    _need(s, "optimizer", "sgd, adam or adamw")
    _need(s, "lr", "the learning rate")
    _need(s, "weight_decay", "0 for none")
    _need(s, "batch_size", "the DataLoader's batch_size")
    if s.epochs is None and s.steps is None:
        raise ConfigError("the exact training run needs training setting epochs (or steps): how long training ran")
    _need(s, "sampler", "'random': DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed)); 'sequential': shuffle=False")
    if s.sampler == "random" and s.seed is None:
        raise ConfigError("training setting seed is missing: sampler 'random' draws its order from "
                          "torch.Generator().manual_seed(seed), so the exact run needs that seed")
    if s.sampler == "sequential" and s.seed is not None:
        raise ConfigError("training setting seed is inconsistent with sampler 'sequential' (no shuffling draws no order)")
    wrong = [k for k in (ADAM_ONLY if s.optimizer == "sgd" else SGD_ONLY) if k in given]
    if wrong:
        raise ConfigError(f"training setting {wrong[0]} is inconsistent with optimizer {s.optimizer!r} "
                          f"({'Adam' if s.optimizer == 'sgd' else 'SGD'}'s setting)")
    if getattr(s, "nesterov", False) and not s.momentum:
        raise ConfigError("training setting nesterov needs a momentum > 0 (as torch.optim.SGD requires)")
    _check_length(s, n)


def _check_length(s, n: int) -> None:
    if s.batch_size > n:
        raise ConfigError(f"training setting batch_size {s.batch_size} is larger than the {n} training points")
    per = steps_per_epoch(n, int(s.batch_size), bool(getattr(s, "drop_last", False)))
    if s.steps is not None and s.epochs is not None and s.steps != s.epochs * per:
        raise ConfigError(f"training setting steps {s.steps} is inconsistent with epochs {s.epochs} × {per} batches of "
                          f"{s.batch_size} from {n} points = {s.epochs * per}")
    steps = total_steps(s, n)
    if s.adam_step is not None and s.adam_step != steps:
        raise ConfigError(f"training setting adam_step {s.adam_step} is inconsistent with the run's {steps} steps")


def recipe(s) -> dict[str, Any]:
    """The settings the exact run replays, as JSON-able values."""
    keys = ("optimizer", "lr", "momentum", "nesterov", "betas", "eps", "weight_decay", "batch_size", "epochs", "steps", "sampler",
            "seed", "drop_last")
    other = ADAM_ONLY if s.optimizer == "sgd" else SGD_ONLY
    return {k: (list(v) if isinstance(v, tuple) else v) for k in keys if (v := getattr(s, k, None)) is not None and k not in other}
