"""The exact training run as an equation, for an owner who knows the whole recipe.

With the start ``θ_0``, the optimiser (:func:`exhume.equations.recipe.update`: torch's SGD, Adam or AdamW with their
learning rate, momentum or betas, weight decay) and the order in which the training points were visited
(:func:`exhume.equations.recipe.batches`: the sampler, its seed, the batch size, the epochs), the final weights are a
known function of the training points::

    θ_T = Run(θ_0; x_1 … x_n, y_1 … y_n)          (T steps, each on the batch the sampler drew)

with no slack: at the training images it holds to rounding. :func:`replay` computes ``Run`` on candidates with soft
labels ``q`` (probabilities: one-hot at the truth), differentiably in both. The unrolled run is cut into segments of
``segment`` steps, each under ``torch.utils.checkpoint`` (recomputed in the backward pass): memory holds ``T/segment``
copies of the parameters and optimiser state plus one segment's graph (default: the shortest segments whose copies fit
:data:`STATE_BYTES`). One evaluation costs about ``4·T`` forward-backward passes of a batch (the replay, its
recomputation and the double backward). The run is replayed with exact ReLU derivatives (a surrogate would change the
run itself); :class:`smoothed_step` smooths only the derivative of ReLU's step, through which the candidates move the
activation patterns. The model runs as given (eval mode): layers that train differently (BatchNorm on batch
statistics, dropout) are refused (:func:`train_mode_failures`). The evaluator's check at the training data is
:func:`exhume.evaluation.residuals.exact_run_residual`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from exhume.equations.recipe import batches, init_state, update
from exhume.starts import frozen_names


class _Step(torch.autograd.Function):
    """``g·1[z > 0]`` (ReLU's backward) in value; differentiated, ``g·α·σ(αz)(1 − σ(αz))`` in ``z`` (a smoothed step).
    Written for torch.func too (``jvp``, a generated vmap rule): :mod:`exhume.attacks.replay.lm` takes Jacobians of the run."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, g: torch.Tensor, alpha: float) -> torch.Tensor:
        return g * (z > 0).to(g.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        z, g, alpha = inputs
        ctx.save_for_backward(z, g)
        ctx.save_for_forward(z, g)
        ctx.alpha = alpha

    @staticmethod
    def _slope(ctx, z: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        s = torch.sigmoid(ctx.alpha * z)
        return ctx.alpha * s * (1 - s)

    @staticmethod
    def backward(ctx, h: torch.Tensor):  # noqa: ANN001, ANN205
        z, g = ctx.saved_tensors
        return h * g * _Step._slope(ctx, z), h * (z > 0).to(h.dtype), None

    @staticmethod
    def jvp(ctx, dz: torch.Tensor, dg: torch.Tensor, _) -> torch.Tensor:  # noqa: ANN001
        z, g = ctx.saved_tensors
        return dz * g * _Step._slope(ctx, z) + dg * (z > 0).to(dg.dtype)


class _ExactReLU(torch.autograd.Function):
    """``relu(z)`` with its exact derivative, whose own derivative in ``z`` is :class:`_Step`'s smoothed one."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, alpha: float) -> torch.Tensor:
        return z.clamp_min(0)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        z, alpha = inputs
        ctx.save_for_backward(z)
        ctx.save_for_forward(z)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # noqa: ANN001, ANN205
        (z,) = ctx.saved_tensors
        return _Step.apply(z, g, ctx.alpha), None

    @staticmethod
    def jvp(ctx, dz: torch.Tensor, _) -> torch.Tensor:  # noqa: ANN001
        (z,) = ctx.saved_tensors
        return dz * (z > 0).to(dz.dtype)


class smoothed_step(TorchFunctionMode):  # noqa: N801 - used as a context manager
    """ReLUs exact in value and derivative (the replayed run is the real one); only the derivative of ReLU's step, which
    moves the candidates through the activation pattern, is ``α·σ'(α·z)`` instead of 0 (``alpha=None``: untouched)."""

    def __init__(self, alpha: float | None) -> None:
        super().__init__()
        self.alpha = alpha

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if self.alpha is not None and func in (torch.relu, F.relu, torch.Tensor.relu):
            return _ExactReLU.apply(args[0], float(self.alpha))
        return func(*args, **(kwargs or {}))


#: the parameters and optimiser states kept at the segments' starts stay below this (default segment: the shortest that
#: does, since one step's graph is far larger than its state)
STATE_BYTES = 1 << 30


@dataclass
class Replay:
    """Everything :func:`replay` needs besides the candidates: the working copy and the recipe."""

    model: nn.Module
    names: tuple[str, ...]  # the trained parameters (the others are frozen at their start)
    start: dict[str, torch.Tensor]  # θ_0 on names
    rest: dict[str, torch.Tensor]  # the frozen parameters
    settings: Any  # the recipe (exhume.victim.TrainingSettings or any object with its attributes)
    order: list[torch.Tensor]  # every step's batch, indices into the candidates
    task: str  # binary | multiclass
    segment: int  # steps per checkpointed segment
    alpha: float | None = None  # smoothed_step's α (None: exact derivatives throughout)


def make_replay(model: nn.Module, params: dict[str, torch.Tensor], start: dict[str, torch.Tensor], settings: Any, n: int,
                task: str, segment: int | None = None, alpha: float | None = None) -> Replay:
    """The replay of ``settings`` on ``n`` points for the working copy ``model``/``params`` (its device and dtype)."""
    frozen = set(frozen_names(model, start))
    names = tuple(k for k in params if k not in frozen)
    order = batches(settings, n)
    state = sum(v.numel() * v.element_size() for v in params.values()) * (3 if settings.optimizer != "sgd" else 2)
    seg = segment or max(1, math.ceil(len(order) * state / STATE_BYTES))
    return Replay(model, names, {k: start[k].to(params[k]) for k in names}, {k: v for k, v in params.items() if k not in names},
                  settings, order, task, seg, alpha)


def batch_loss(r: Replay, theta: dict[str, torch.Tensor], x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The mean loss of a batch against soft labels ``q`` (binary: the probability of +1; multiclass: rows of probabilities)."""
    with smoothed_step(r.alpha):
        out = functional_call(r.model, {**r.rest, **theta}, (x,))
    if r.task == "binary":
        out = out.reshape(-1)
        return (q * nn.functional.softplus(-out) + (1 - q) * nn.functional.softplus(out)).mean()
    return -(q * torch.log_softmax(out, 1)).sum(1).mean()


def _steps(r: Replay, first: int, last: int, x: torch.Tensor, q: torch.Tensor, keys: tuple[str, ...], *flat: torch.Tensor,
           graph: bool = True) -> tuple[torch.Tensor, ...]:
    """Steps ``first … last − 1`` from the flat parameters and state ``flat`` (ordered as ``names`` then ``keys``)."""
    k = len(r.names)
    theta, state = dict(zip(r.names, flat[:k])), dict(zip(keys, flat[k:]))
    for t in range(first, last):
        idx = r.order[t]
        with torch.enable_grad():
            if not graph:
                theta = {n: v.detach().requires_grad_() for n, v in theta.items()}
            loss = batch_loss(r, theta, x[idx], q[idx])
            g = torch.autograd.grad(loss, [theta[n] for n in r.names], create_graph=graph)
        theta, state = update(r.settings, theta, dict(zip(r.names, g)), state, t + 1)
        if not graph:
            theta = {n: v.detach() for n, v in theta.items()}
            state = {n: v.detach() for n, v in state.items()}
    return (*theta.values(), *(state[key] for key in keys))


def replay(r: Replay, x: torch.Tensor, q: torch.Tensor, graph: bool = True) -> dict[str, torch.Tensor]:
    """``θ_T`` over ``r.names`` after the whole run on candidates ``x`` with soft labels ``q`` (differentiable when ``graph``)."""
    graph = graph and torch.is_grad_enabled()
    state = init_state(r.settings, r.start)
    keys = tuple(state)
    flat = (*(v.detach().clone().requires_grad_(graph) for v in r.start.values()), *state.values())
    total = len(r.order)
    for first in range(0, total, r.segment):
        last = min(total, first + r.segment)
        if graph:
            flat = checkpoint(_steps, r, first, last, x, q, keys, *flat, use_reentrant=False)
        else:
            flat = _steps(r, first, last, x, q, keys, *flat, graph=False)
    return dict(zip(r.names, flat[:len(r.names)]))


def relative_gap(r: Replay, theta: dict[str, torch.Tensor], final: dict[str, torch.Tensor]) -> torch.Tensor:
    """``‖θ_sim − θ_T‖² / ‖θ_T − θ_0‖²`` over the trained parameters (0: the run reproduces the weights)."""
    num = sum(((theta[k] - final[k]) ** 2).sum() for k in r.names)
    den = sum(((final[k] - r.start[k]) ** 2).sum() for k in r.names)
    return num / den.clamp_min(1e-300)


def hard_labels(task: str, y: torch.Tensor, k: int | None, dtype: torch.dtype) -> torch.Tensor:
    """exhume's labels (binary ±1, multiclass class ids) as the soft labels of :func:`replay` (one-hot)."""
    if task == "binary":
        return (y > 0).to(dtype)
    return nn.functional.one_hot(y.long(), int(k or int(y.max()) + 1)).to(dtype)


def train_mode_failures(model: nn.Module) -> list[str]:
    """Layers the replay cannot run as training ran them (plain words; empty: none)."""
    out = []
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    if norms:
        out.append(f"the network has {', '.join(norms)} layers, which train on batch statistics; the exact run replays the "
                   "network as it evaluates")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        out.append("the network has dropout, whose random masks during training are not part of the recipe")
    return out
