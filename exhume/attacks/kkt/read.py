"""The informed adversary's read of the first layer (docs/METHODS.md §7): with every training record but one known, the
target in closed form from the layer the flattened input enters through.

There ``z = W·x̃ + b`` (``x̃`` centred by a public mean) and what training added to ``W`` is ``Σ_i G_i·x̃_iᵀ``, ``G_i`` what
training accumulated of ``∂h/∂z`` at record ``i``: zero on the units that were shut at it. Off the known records' span
``Q`` only the target's term is left, rank one: ``u·σ·vᵀ`` with ``v`` the target's part outside the span. Inside it, unit
``j``'s row is ``Σ_{k open at j} G_kj·c_k + u_j·d`` (``c_k = Qᵀx̃_k``): projected off the coordinates of the known records
open at ``j`` (within ``MARGIN`` of opening at the final weights, or at the start when it is known), each unit gives ``d``
times its ``u_j``, solved by least squares over the units, reweighted so that the few units whose open records were
miscounted do not carry the solution. The target is ``Q·d + σ·v`` up to one scale and its sign; the scale is the one that puts the most
pixels at the background (0) without overshooting 1, both signs returned. Weights (with a known start, what training
added) and the known records only; it applies where the remainder is rank one by the span rule and the layer's
units shut (a ReLU-like activation after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import functional_call

from exhume.attacks.kkt.subspace import input_layer
from exhume.equations.remainder import orthonormal
from exhume.equations.span import delta_of, span_of
from exhume.equations.trajectory import start_decay_for
from exhume.models.tap import Tap

#: a known record counts as open at a unit whose pre-activation lies above −MARGIN × its mean |pre-activation|: a unit
#: shut at the end may have been open during training (the reweighting lets go of the units where that was so). Chosen
#: with REWEIGHTS on victims held out from the measured ones: docs/defaults.md
MARGIN = 0.03
#: the background's pixels: within this of 0 after the scale
BACKGROUND = 0.01
#: how many times the in-span least squares is reweighted by the units' residuals (0: plain least squares; docs/defaults.md)
REWEIGHTS = 10
#: the scales tried, relative to the estimate's largest pixel
SCALES = torch.logspace(-2, 1.5, 400, dtype=torch.float64)


@dataclass
class Read:
    """The read's candidates ``(2, *input_shape)`` (display space, both signs, the better-scored first), or none with why."""

    candidates: torch.Tensor | None
    why: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _OffSpan:
    """The first layer off the known records' span, shown rank one: what the read and :func:`aligned` start from."""

    name: str
    params: dict[str, torch.Tensor]
    mean: torch.Tensor
    x: torch.Tensor  # the known records, centred and flattened (float64)
    w: torch.Tensor  # the layer's weights, or with the start known what training added
    q: torch.Tensor  # the known records' span, orthonormal (D, r)
    rest: torch.Tensor  # w off that span
    span: Any  # span_of's answer on ``rest`` (rank one)


def _off_span(view, n: int) -> _OffSpan | Read:
    """The first layer off the known records' span where it is rank one by the span rule, else a :class:`Read` with why."""
    known = view.known
    if known is None or len(known) != n - 1:
        return Read(None, f"the read needs every record but one known: {0 if known is None else len(known)} of n = {n} are")
    model = view.model
    params = {k: v.detach() for k, v in model.named_parameters()}
    name = input_layer(model, params, tuple(view.input_shape))
    if name is None:
        return Read(None, "the input enters through no linear map")
    mean = view.mean.double()
    x = (known.x.double() - mean).reshape(len(known), -1)
    w = _added(view, name, params[name].double(), n)
    q = orthonormal(x)  # (D, r)
    rest = w - (w @ q) @ q.T
    span = span_of(rest, 1, next(model.parameters()).dtype, inputs_fixed=True, basis=True)
    if not span.shows:
        return Read(None, f"the first layer off the known records' span is not rank one: {span.why} (i.i.d. noise reads as "
                    "the initialisation's, DP-SGD's too)", _facts(name, span))
    return _OffSpan(name, params, mean, x, w, q, rest, span)


def _facts(name: str, span) -> dict[str, Any]:
    return {"read_layer": name, "read_sigma2_over_sigma1": span.facts.get("sigma_after_n"), "read_margin": MARGIN,
            "read_reweights": REWEIGHTS}


def aligned(view, n: int, x: torch.Tensor) -> torch.Tensor | None:
    """Each record of ``x`` ``(k, *input_shape)`` (display space) scored by ``|cos|`` between its part off the known
    records' span and the rank-one remainder's direction there (the target's, up to sign), or None where that remainder
    is not rank one: the candidate game's score where the read applies (the trained-on candidate's is 1 up to noise)."""
    off = _off_span(view, n)
    if isinstance(off, Read):
        return None
    v = off.span.basis[:, 0].to(off.rest)
    c = (x.double().to(off.mean.device) - off.mean).reshape(len(x), -1)
    c = c - (c @ off.q) @ off.q.T
    norm = c.norm(dim=1)
    return torch.where(norm > 0, (c @ v).abs() / norm.clamp_min(torch.finfo(c.dtype).tiny), torch.zeros_like(norm))


def read_target(view, n: int) -> Read:
    """The one unknown training record of ``view`` (its ``known`` records: ``n − 1`` of them) read off its first layer."""
    off = _off_span(view, n)
    if isinstance(off, Read):
        return off
    model, name, params, x, q, rest, span = view.model, off.name, off.params, off.x, off.q, off.rest, off.span
    info = _facts(name, span)
    xs = x.reshape(len(x), *view.input_shape).to(next(model.parameters()).dtype)
    z, shut = _pre_activations(model, params, name, xs)
    if shut < 0.01:
        return Read(None, f"the units of {name} never shut at the known records (no ReLU-like activation after it)", info)
    s, v = span.singular[0].to(rest), span.basis[:, 0]  # the rank-one remainder u·σ·vᵀ, from the rule's own decomposition
    u = rest @ v / s
    opened = _opened(z)
    if getattr(view, "start", None):  # with the start known, a record counts as open where it was open at the start too
        at_start = {**params, **{k: w0.to(params[k]) for k, w0 in view.start.items() if k in params}}
        opened |= _opened(_pre_activations(model, at_start, name, xs)[0])
    d = _in_span(off.w @ q, x @ q, u, opened)
    images, scores = _scaled(q @ d + s * v, off.mean.reshape(-1))
    order = torch.argsort(-scores, stable=True)
    out = images[order].reshape(2, *view.input_shape).float()
    return Read(out, "read", {**info, "read_background_pixels": [int(scores[i]) for i in order], "read_shut_share": shut})


def _added(view, name: str, w: torch.Tensor, n: int) -> torch.Tensor:
    """``W``, or with its start known what training added (:func:`~exhume.equations.span.delta_of`, ``c`` by kkt's rule)."""
    start = getattr(view, "start", None)
    if not start or name not in start:
        return w
    return delta_of(w, start[name].double(), start_decay_for(view, "auto", n)[0])[0]


def _pre_activations(model, params: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The layer's outputs ``z`` at ``x`` ``(k, h)`` (float64) under ``params``, and the share of ``∂h/∂z`` exactly zero."""
    module = name.rpartition(".")[0]
    x = x.detach().requires_grad_(True)
    with Tap(model, [module], keep="output") as tap:
        out = functional_call(model, params, (x,))
    z = tap.seen[module]
    g = torch.autograd.grad(out.sum(), z)[0]  # rows independent: the sum's gradient is each row's own
    return z.detach().double().reshape(x.shape[0], -1), float((g == 0).double().mean())


def _opened(z: torch.Tensor) -> torch.Tensor:
    """``(k, h)``: whether record ``k`` counts as open at unit ``j`` (within ``MARGIN`` of opening)."""
    return z > -MARGIN * z.abs().mean(1, keepdim=True)


def _in_span(wq: torch.Tensor, c: torch.Tensor, u: torch.Tensor, open_: torch.Tensor) -> torch.Tensor:
    """``d`` by least squares over the units, reweighted: ``Σ_j ω_j·u_j²·P_j·d = Σ_j ω_j·u_j·P_j·(WQ)_j``, ``P_j`` off the
    open records, ``ω_j = 1 / max(1, e_j / median e)²`` with ``e_j`` unit ``j``'s squared residual, ``REWEIGHTS`` times.
    A unit where a record counted shut was open during training fits badly whatever ``d`` (a few units carry most of
    the truth's residual) and is let go instead of pulling ``d`` along the directions few units see."""
    h, r = wq.shape
    bases, owner, p = [], [], wq.clone()
    for j in range(h):
        rows = c[open_[:, j]]
        if rows.shape[0]:
            bases.append(torch.linalg.qr(rows.T)[0])
            owner.append(torch.full((bases[-1].shape[1],), j, dtype=torch.long))
            p[j] -= bases[-1] @ (bases[-1].T @ wq[j])  # P_j·(WQ)_j
    q = torch.cat(bases, 1) if bases else torch.zeros(r, 0, dtype=wq.dtype)  # (r, Σ_j open_j): every unit's basis
    owner = torch.cat(owner) if owner else torch.zeros(0, dtype=torch.long)

    def solve(weights: torch.Tensor) -> torch.Tensor:
        g = weights * u ** 2
        a = g.sum() * torch.eye(r, dtype=wq.dtype) - (q * g[owner]) @ q.T  # Σ_j ω_j·u_j²·P_j
        return torch.linalg.lstsq(a, ((weights * u) @ p)[:, None]).solution[:, 0]

    d = solve(torch.ones(h, dtype=wq.dtype))
    for _ in range(REWEIGHTS):
        seen = torch.zeros(h, dtype=wq.dtype).index_add_(0, owner, (q.T @ d) ** 2)  # ‖Q_jᵀd‖²
        e = ((p * p).sum(1) - 2 * u * (p @ d) + u ** 2 * (d @ d - seen)).clamp_min(0)  # ‖P_j·((WQ)_j − u_j·d)‖²
        d = solve(1.0 / torch.clamp(e / e.median().clamp_min(torch.finfo(e.dtype).tiny), min=1.0) ** 2)
    return d


def _scaled(y: torch.Tensor, mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sign, ``μ + t·y/max|y|`` at the scale ``t`` with the most background pixels among those that overshoot 1
    by less than one pixel's worth; clipped to [0, 1]. Returns the two images and their background counts."""
    base = y / y.abs().max()
    images, scores = [], []
    for sign in (1.0, -1.0):
        imgs = mean[None] + sign * SCALES[:, None] * base[None]
        score = (imgs.abs() < BACKGROUND).sum(1).double()
        score[(torch.relu(imgs - 1) ** 2).sum(1) > 1] = -1.0
        best = int(torch.argmax(score))
        images.append(imgs[best].clamp(0, 1))
        scores.append(score[best])
    return torch.stack(images), torch.stack(scores)

