"""kkt's problem: the working copy of the victim, the equation the candidates solve (stationary, or with a known start
the trajectory's), the multipliers' form and scale, the training inputs' span, and the starting unknowns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from exhume.attacks.engine.base import DTYPES, attack_model, initial_candidates
from exhume.attacks.kkt.closed_form import one_point
from exhume.attacks.kkt.settings import LR_LAMBDA_MARGIN, START_CANDIDATES_PER_POINT, candidate_count, equation_for, resolve_lr_lambda
from exhume.attacks.kkt.subspace import Subspace, data_subspace, remembered_input_layer
from exhume.equations.formulation import Formulation, resolve
from exhume.equations.span import learned_part
from exhume.equations.trajectory import StartEquation, added_inputs_layer, build_equation, multiplier_scale


@dataclass
class Problem:
    """The attack's working copy of the victim and its unknowns (centred candidates ``x``, ``u``)."""

    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    norm2: torch.Tensor  # ‖θ‖² (of the learned part with denoise), or the known-start equation's ‖target‖²
    n: int
    m: int
    form: Formulation
    mean: torch.Tensor
    y: torch.Tensor
    x: torch.Tensor | None  # None in the problem restarts share (setup), until start draws them
    u: torch.Tensor | None
    target: dict[str, torch.Tensor] | None = None
    span: Subspace = field(default_factory=lambda: Subspace(None))
    lr_lambda: float = LR_LAMBDA_MARGIN  # u's learning rate, 'auto' resolved for the formulation
    eq: StartEquation | None = None  # the known-start equation (exhume.equations.trajectory), or the stationary one
    closed: bool = False  # multipliers solved in closed form every step (exhume.attacks.kkt.closed_form), u not learned
    penalty: Any = None  # the known-start span penalty one layer up (exhume.attacks.kkt.stage.Penalty), or None


def setup(cfg: dict[str, Any], given: frozenset[str], view, dev: torch.device, init: torch.Tensor | None = None) -> Problem:
    """What the restarts of one victim and settings (their rates aside) share: the working copy of the victim (the user's
    module stays as it is), the equation, the multipliers' form and scale, the span; its unknowns are not drawn yet
    (:func:`start`). ``given``: the settings the caller chose; ``init``: starting images, whose count sets ``m``."""
    dtype = DTYPES[cfg["dtype"]]
    model, params = attack_model(view.model, dev, dtype)
    n = cfg["n_guess"] or view.n_train_hint or 100
    equation = equation_for(cfg["start_equation"], view)
    per_point = cfg["candidates_per_point"]
    if equation != "stationary" and view.start is not None and "candidates_per_point" not in given:
        per_point = START_CANDIDATES_PER_POINT
    m = cfg["m"] or (init.shape[0] if init is not None else candidate_count(None, per_point, n))
    # with a known start only the parameters whose start is unknown need their learned part (their weights' SVDs)
    pool = params if equation == "stationary" or view.start is None else {k: v for k, v in params.items() if k not in view.start}
    target, denoised = learned_part(pool, n) if cfg["denoise"] != "off" and pool else (None, {})
    eq = None
    if equation == "stationary":
        form = resolve(view, model, cfg["formulation"], cfg["lambda_scale"], params, n, m, dtype)
        form.info.update(denoised)
    else:
        eq, form = start_equation(cfg, view, model, params, equation, n, m, dtype, target)
        # the same span at half the cost where the trained parameters enter linearly (learned or solved multipliers)
        eq = one_point(model, eq, view.mean.to(dev, dtype), form.labels, form.objective)
    closed = cfg["multipliers"] == "closed-form"
    form.info["multipliers_solved"] = "closed-form least squares every step" if closed else "learned (λ = S·u)"
    found = span(cfg, view, model, params, n, eq)
    # the stationarity term is relative to what the candidates must explain
    norm2 = eq.norm2 if eq is not None else sum((v**2).sum() for v in (params if target is None else target).values())
    return Problem(model, params, norm2, n, m, form, view.mean.to(dev, dtype), form.labels.to(dev), None, None,
                   target if eq is None else None, found, LR_LAMBDA_MARGIN, eq, closed)


def start(shared: Problem, cfg: dict[str, Any], view, seed: int, init: torch.Tensor | None = None) -> Problem:
    """``shared`` (:func:`setup`) with one restart's unknowns: drawn from ``seed`` (or ``init``), projected onto the
    span, and ``u``'s learning rate from ``cfg`` ('auto' resolved for the formulation)."""
    x, u = unknowns(cfg, view, shared.m, shared.form.signed, shared.eq, seed, init, shared.mean.device)
    if shared.closed:
        u.requires_grad_(False)
    with torch.no_grad():
        x.copy_(shared.span.project(x))
    lr_lambda = resolve_lr_lambda(cfg["lr_lambda"], shared.form.name if shared.eq is None else "output")
    return replace(shared, x=x, u=u, lr_lambda=lr_lambda)


def unknowns(cfg: dict[str, Any], view, m: int, signed: bool, eq: StartEquation | None, seed: int, init: torch.Tensor | None,
             dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The starting candidates ``x`` (not yet projected onto the span) and multipliers ``u`` drawn from ``seed``."""
    dtype = DTYPES[cfg["dtype"]]
    gen = torch.Generator().manual_seed(seed)
    x = initial_candidates(init, m, view.input_shape, view.mean, cfg["init_scale"], gen, dtype).to(dev).requires_grad_()
    shape = (m,) if eq is None else (m, eq.multipliers)
    u = (torch.randn if signed else torch.rand)(shape, generator=gen, dtype=dtype).to(dev).requires_grad_()
    return x, u


def start_equation(cfg: dict[str, Any], view, model, params, equation: str, n: int, m: int, dtype,
                   learned) -> tuple[StartEquation, Formulation]:
    """The known-start equation and its formulation: the victim's ``h``, the multipliers' sign (signed with 'output',
    non-negative with a classifier's margin or loss: a training point's gradient enters with the sign its label gives),
    the probe scale."""
    form = resolve(view, model, cfg["formulation"], 1.0, params, n, m, dtype)
    eq = build_equation(view, model, params, equation, n, cfg["start_decay"], cfg["preconditioner"], unknown=learned)
    if cfg["lambda_scale"] == "auto":
        scale, rule = multiplier_scale(model, eq, view.mean.to(next(iter(params.values())).device, dtype), form.labels,
                                       form.objective, n)
    else:
        scale, rule = float(cfg["lambda_scale"]), {"lambda_scale_rule": "given"}
    form.signed = form.name == "output"
    form.scale = scale
    form.info.update(rule, multipliers=f"{'signed' if form.signed else 'non-negative'}, "
                     f"{'one per candidate' if eq.shared else 'one per candidate and gradient point'}")
    return eq, form


def frozen_layer_reason(layer: str) -> str:
    """Why a known start's frozen input layer gives no span."""
    return f"{layer} is frozen at its start: its weights show the data it was trained on before, not this training set"


def span(cfg: dict[str, Any], view, model, params, n: int, eq: StartEquation | None) -> Subspace:
    """The training inputs' span (:mod:`exhume.attacks.kkt.subspace`); with a known start read from what training added
    to the input layer."""
    if cfg["subspace"] == "off":
        return Subspace(None)
    trained_in = next((w.dtype for w in view.model.parameters()), None)  # the precision floor is the victim's, not the attack's
    extra: dict[str, Any] = {}
    if eq is not None and view.start is not None:
        layer = remembered_input_layer(view.model, model, params, tuple(view.input_shape))
        if layer is not None and layer not in eq.names:  # frozen: no SVD of it is needed to know it shows no span
            return Subspace(None, {"subspace_used": "none", "subspace_layer": layer, "subspace_reason": frozen_layer_reason(layer)})
        start = {k: v.to(params[k]) for k, v in view.start.items()}
        params, extra = added_inputs_layer(eq, params, start, math.prod(view.input_shape))
    found = data_subspace(model, params, tuple(view.input_shape), n, precision=trained_in)
    layer = found.info.get("subspace_layer")
    if found.basis is not None and eq is not None and view.start is not None and layer not in eq.names:
        found = Subspace(None, {"subspace_used": "none", "subspace_layer": layer, "subspace_reason": frozen_layer_reason(layer)})
    found.info.update(extra)
    return found
