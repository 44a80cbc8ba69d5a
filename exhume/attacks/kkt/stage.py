"""The training inputs' span one layer up: kkt solved in a layer's input space, then inverted to images.

A CNN's first layer is a small convolution whose patches fill their few directions, so its weights show no span
(:mod:`exhume.attacks.kkt.subspace`). Near a stationary point the span shows one layer up instead: the fully
connected layer after the convolutions is ``W = Σ_i δ_i φ_iᵀ`` over the training images' features ``φ_i``, rank
≈ n (:mod:`exhume.equations.span` reports it). kkt's ``subspace="auto"`` then solves the stationarity
equation of the layers from there up (:class:`Above`: that layer's input replaced by the unknowns; they hold
nearly all of ``θ``, 99.98 % on the 28×28 CNN) for features in that layer's row space, exactly as it solves
an MLP's first layer, and inverts each candidate's features through the layers below to pixels (Oz et al.
2024 invert a head's features through a frozen extractor the same way). Why not a penalty in pixel space
or a full-equation finish: docs/METHODS.md §5 and docs/defaults.md.

:func:`layer_above` finds the layer: the first ``nn.Linear`` after the input layer that sees more than ``n``
directions, whose spectrum has collapsed (``σ_{n+1}/σ_1 ≤ SPAN_GAP``), through which alone the input reaches the
output (checked: the network equals :class:`Above` at its features), and whose weights show a span by
:func:`~exhume.attacks.kkt.subspace.data_subspace`'s rule, at most its top ``n`` directions (a stationary point's ``W``
has rank ≤ n).
The features are scaled by the largest feature of uniform-noise images (weights and data mean only), so that
the display prior ``[0, 1]`` bounds them from both sides (ReLU features are non-negative).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exhume.attacks.kkt.subspace import data_subspace
from exhume.deadline import NEVER, Deadline

#: the share of a timed run spent on the feature stage; the rest inverts its features to images
STAGE_SHARE = 0.75
#: Adam steps (and learning rate, on centred pixels) of the inversion through the layers below
INVERT_STEPS = 1000
INVERT_LR = 0.02
#: a layer shows the span when σ_{n+1}/σ_1 of its weight is at most this (exhume/equations/span.py reports the same
#: rule): on the 28×28 CNN the stage gained at 2.6e-3 and below, tied at 1.4e-2, and lost on an 8×8 CNN at 2.2e-2
SPAN_GAP = 1e-2
#: random images whose features set the features' scale, and the relative tolerance of the cut's check
PROBES = 64
CUT_TOLERANCE = 1e-4


class Above(nn.Module):
    """The network from module ``layer``'s input on: ``forward(v)`` feeds ``scale · v`` (rows of features) to ``layer``
    in place of what the layers below would give it. Parameters below ``layer`` become buffers (fixed, not unknowns
    of the equation); the ones from ``layer`` on keep their names under ``net.``."""

    def __init__(self, model: nn.Module, layer: str, input_shape: tuple[int, ...], scale: float) -> None:
        super().__init__()
        self.net = copy.deepcopy(model)
        names = [k for k, _ in self.net.named_parameters()]
        first = next(i for i, k in enumerate(names) if k.startswith(layer + "."))
        for name in names[:first]:
            owner, _, leaf = name.rpartition(".")
            mod = self.net.get_submodule(owner) if owner else self.net
            value = getattr(mod, leaf).detach().clone()
            del mod._parameters[leaf]
            mod.register_buffer(leaf, value)
        self.layer, self.input_shape, self.scale = layer, tuple(input_shape), float(scale)
        self._v: torch.Tensor | None = None
        self.net.get_submodule(layer).register_forward_pre_hook(self._feed)  # a bound method: a deepcopy rebinds it

    def _feed(self, module, args):
        return (self._v * self.scale,)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        self._v = v  # the layers below run on one blank input: their output is replaced, only its shape's rest matters
        return self.net(v.new_zeros((1, *self.input_shape)))


def features_of(model: nn.Module, layer: str, x: torch.Tensor) -> torch.Tensor:
    """What module ``layer`` receives when ``model`` runs on ``x``, one row per input."""
    got: list[torch.Tensor] = []
    handle = model.get_submodule(layer).register_forward_pre_hook(lambda m, a: got.append(a[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return got[0].reshape(x.shape[0], -1)


def _cut(model: nn.Module, layer: str, input_shape: tuple[int, ...], probe: torch.Tensor) -> Above | None:
    """:class:`Above` at ``layer``, or None where the input reaches the output some other way too (a skip)."""
    with torch.no_grad():
        feats = features_of(model, layer, probe)
        scale = float(feats.max())
        if not scale > 0:
            return None
        above = Above(model, layer, input_shape, scale)
        try:
            full, cut = model(probe), above(feats / scale)
        except RuntimeError:  # the layers above combine the input's batch with the features': not a cut
            return None
    if full.shape != cut.shape or not torch.allclose(full, cut, rtol=CUT_TOLERANCE, atol=CUT_TOLERANCE * float(full.abs().max().clamp_min(1e-12))):
        return None
    return above


def _input_layer(model: nn.Module) -> str | None:
    """The module owning the first weight of two or more dimensions: where the input enters."""
    return next((k.rpartition(".")[0] for k, w in model.named_parameters() if w.dim() >= 2), None)


def may_stage(model: nn.Module) -> bool:
    """Whether :func:`layer_above` could find a layer on ``model``: its input enters through something other than an
    ``nn.Linear`` and an ``nn.Linear`` follows (shapes only, no SVD)."""
    first = _input_layer(model)
    if first is None or isinstance(model.get_submodule(first), nn.Linear):
        return False
    return any(isinstance(m, nn.Linear) for m in model.modules())


def layer_above(model: nn.Module, input_shape: tuple[int, ...], mean: torch.Tensor, n: int,
                precision: torch.dtype | None = None) -> tuple[Above, Any] | None:
    """The first layer above the input layer whose weights show the training inputs' span: ``(Above, Subspace)``, or None."""
    linears = [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear) and mod.in_features > n]
    if not linears:
        return None
    p0 = next(model.parameters())
    gen = torch.Generator().manual_seed(0)
    probe = (torch.rand((PROBES, *input_shape), generator=gen, dtype=torch.float64) - mean.double().cpu()).to(p0)
    for name in linears:
        if name == _input_layer(model):
            continue  # the input layer: subspace.py reads its span
        w = model.get_submodule(name).weight.detach().double().cpu()
        sv = torch.linalg.svdvals(w)
        if n >= sv.numel() or not float(sv[n]) <= SPAN_GAP * float(sv[0]):
            continue  # its spectrum has not collapsed to rank ≤ n: not (yet) the training features' span
        above = _cut(model, name, input_shape, probe)
        if above is None:
            continue
        d = model.get_submodule(name).in_features
        span = data_subspace(above, dict(above.named_parameters()), (d,), n, precision=precision)
        if span.basis is not None:
            if span.basis.shape[1] > n:  # W = Σ_i δ_i φ_iᵀ has rank ≤ n: directions past n are what has not settled yet
                span.info.update(subspace_rank=n, subspace_rank_above_noise=int(span.basis.shape[1]))
                span.basis = span.basis[:, :n].contiguous()
            return above, span
    return None


def invert(model: nn.Module, layer: str, target: torch.Tensor, mean: torch.Tensor, seed: int,
           deadline: Deadline = NEVER) -> tuple[torch.Tensor, dict[str, Any]]:
    """Images whose features at ``layer`` match ``target`` (rows): Adam on centred pixels, the display prior ``[0, 1]``;
    ``INVERT_STEPS`` steps, or fewer at ``deadline`` (at least one). Returns display-space images and what it did."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn((target.shape[0], *mean.shape), generator=gen, dtype=target.dtype) * 0.1).to(target.device).requires_grad_()
    opt = torch.optim.Adam([x], lr=INVERT_LR)
    norm = target.norm(dim=1).clamp_min(1e-12)
    t0, steps = time.perf_counter(), 0
    while steps < INVERT_STEPS:
        steps += 1
        opt.zero_grad(set_to_none=True)
        fit = ((features_of(model, layer, x) - target).norm(dim=1) / norm).pow(2).sum()
        v = x + mean
        (fit + (torch.relu(v - 1) ** 2 + torch.relu(-v) ** 2).sum()).backward()
        opt.step()
        if deadline.passed():
            break
    with torch.no_grad():
        err = (features_of(model, layer, x) - target).norm(dim=1) / norm
    return (x.detach() + mean), {"inversion_steps": steps, "inversion_seconds": round(time.perf_counter() - t0, 3),
                                 "inversion_feature_error_median": float(err.median())}


def feature_view(view, above: Above):
    """``view`` with the features as its inputs (a shallow copy: the attacks never build an attacker's view)."""
    d = above.net.get_submodule(above.layer).in_features
    fview = copy.copy(view)
    fview.model, fview.input_shape, fview.mean = above, (d,), torch.zeros(d, dtype=view.mean.dtype)
    fview.start, fview.training = None, None
    return fview


def stage_folder(out, resume: bool) -> Path | None:
    """Where a staged run's stage checkpoints: ``out/feature_stage`` (None without ``out``); a fresh run first drops
    a checkpoint an earlier run left there, so that a later ``resume`` cannot pick it up."""
    if out is None:
        return None
    folder = Path(out) / "feature_stage"
    folder.mkdir(parents=True, exist_ok=True)
    if not resume:
        (folder / "checkpoint.pt").unlink(missing_ok=True)
    return folder


def summary_of(stage, above: Above, span, seconds: float, inversion: dict[str, Any]) -> dict[str, Any]:
    """What the result's config records of the stage."""
    return {"subspace_used": "layer above", "subspace_layer": span.info.get("subspace_layer"),
            "subspace_rank": span.info.get("subspace_rank"), "subspace_dims": span.info.get("subspace_dims"),
            "subspace_reason": f"the first layer shows no span; {above.layer}'s input does: kkt solved the equation of the "
                               "layers from there up for features in its row space, inverted to images through the layers below",
            "feature_scale": above.scale, "feature_stage_iterations": stage.record.iterations,
            "feature_stage_seconds": round(seconds, 3), **inversion,
            "feature_stage_relative_stationarity": stage.record.final_relative_stationarity}
