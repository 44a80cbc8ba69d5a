"""The training inputs' span one layer up: kkt solved in a layer's input space, then inverted to images.

A CNN's first layer is a small convolution whose patches fill their few directions, so its weights show no span.
Near a stationary point the span shows one layer up instead: the fully connected layer after the convolutions is
``W = Σ_i δ_i φ_iᵀ`` over the training images' features. kkt's ``subspace="auto"`` then solves the stationarity
equation of the layers from there up (:class:`Above`: that layer's input replaced by the unknowns) for features in
that layer's row space, as it solves an MLP's first layer, and inverts each candidate's features through the layers
below to pixels (as Oz et al. 2024 invert a head's features); why: docs/METHODS.md §5. :func:`layer_above` finds the
first ``nn.Linear`` above the input layer whose weights show the span (:func:`exhume.equations.span.span_of`) and
through which alone the input reaches the output; whether a run takes the stage is one predicate,
:meth:`exhume.attacks.kkt.attack.KKTAttack.stage_on`. Features are scaled by the largest of uniform-noise images'.

With the start known, what training added to that layer (``Δ = W − c·W_0``, :func:`exhume.equations.span.delta_of`)
shows the span at any point of training, stationary or not; the same predicate then finds the layer from ``Δ`` and
kkt keeps solving the known-start equation in pixels, with :func:`span_penalty` (the candidates' features' distance
to ``Δ``'s row space, weighted by ``span_penalty``) added to its loss (docs/METHODS.md §5).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from exhume.attacks.engine.priors import range_penalty
from exhume.attacks.kkt.subspace import Subspace, as_subspace
from exhume.deadline import NEVER, Deadline
from exhume.equations.span import delta_of
from exhume.models.tap import features_of

#: the share of a timed run spent on the feature stage; the rest inverts its features to images
STAGE_SHARE = 0.75
#: Adam steps (and learning rate, on centred pixels) of the inversion through the layers below
INVERT_STEPS = 1000
INVERT_LR = 0.02
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


class Found(NamedTuple):
    """The layer one up that shows the span: its cut (:class:`Above`), the span, and whether that span was read from what
    training added (``added``: a known start, the span penalty's layer) or from the weights (the feature stage's)."""

    above: Above
    span: Subspace
    added: bool = False


def layer_above(model: nn.Module, input_shape: tuple[int, ...], mean: torch.Tensor, n: int,
                precision: torch.dtype | None = None, start: dict[str, torch.Tensor] | None = None,
                decay: float | None = None) -> Found | None:
    """The first ``nn.Linear`` above the input layer whose weights show the training inputs' span by the span rule
    (:func:`exhume.equations.span.span_of`, its inputs having moved in training) and through which alone the input
    reaches the output, or None. ``start``: the known start's weights, whose trained layers are then read as what
    training added (:func:`~exhume.equations.span.delta_of` with ``c = decay``; None: fitted); a layer left at its start
    is skipped."""
    linears = [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear) and mod.in_features > n]
    if not linears:
        return None
    p0 = next(model.parameters())
    gen = torch.Generator().manual_seed(0)
    probe = (torch.rand((PROBES, *input_shape), generator=gen, dtype=torch.float64) - mean.double().cpu()).to(p0)
    first = _input_layer(model)
    for name in linears:
        if name == first:
            continue  # the input layer: subspace.py reads its span
        key, w = f"{name}.weight", model.get_submodule(name).weight
        if start is not None:
            if key not in start or torch.equal(start[key].to(w), w.detach()):
                continue  # its start unknown, or frozen: nothing added
            w, c = delta_of(w, start[key], decay)
        span = as_subspace(f"net.{key}" if start is None else key, w, n, precision, inputs_fixed=False)
        if span.basis is None:
            continue  # not (yet) the training features' span
        above = _cut(model, name, input_shape, probe)
        if above is not None:
            if start is not None:
                span.info.update(subspace_from="what training added", subspace_start_decay=c)
            return Found(above, span, start is not None)
    return None


class Penalty(NamedTuple):
    """The span penalty of a run (:func:`span_penalty`): the layer whose input it reads, the row space's orthonormal
    ``basis`` (columns), its ``weight`` and what the record keeps of it."""

    layer: str
    basis: torch.Tensor
    weight: float
    info: dict[str, Any]


def span_penalty(model: nn.Module, penalty: Penalty, x: torch.Tensor) -> torch.Tensor:
    """The candidates' mean squared relative distance of their features at ``penalty.layer`` (the input it receives on
    ``model``, through the layers below at their trained values) to the row space ``penalty.basis``; unweighted."""
    f = features_of(model, penalty.layer, x)
    basis = penalty.basis.to(f)
    out = f - (f @ basis) @ basis.T
    return (out.pow(2).sum(1) / f.pow(2).sum(1).clamp_min(1e-12)).mean()


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
        (fit + range_penalty(v, 0.0, 1.0)).backward()
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
