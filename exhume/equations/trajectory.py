"""The equation of training that stopped early, for an attacker who knows the start ``θ_0`` (docs/METHODS.md §6).

What training added is a weighted sum of per-sample gradients along the trajectory; frozen at a few points of it,
the unknowns collapse into one multiplier per candidate and point::

    P ⊙ (θ_T − c·θ_0)  ≈  Σ_k Σ_j λ_jk ∇_θ h(Φ(θ^(k); x̂_j), ŷ_j)

``"trajectory"``: the one point ``θ_T``; ``"endpoints"``: ``θ_0`` and ``θ_T``. ``c``, the start's share left by weight
decay: from the training settings (:meth:`exhume.victim.start.TrainingSettings.decay`), fitted in closed form at
every step, or given; ``P``: Adam's ``√v̂ + ε`` from the owner's ``exp_avg_sq`` (not where training forgot its start,
:func:`_preconditioner`). A parameter bit-equal to its start is left out; one whose start is unknown enters as its
weights (``c = 0``), or their part above the initialisation's noise. Without any start, ``"trajectory"`` is the
weights-only equation with signed multipliers. The evaluator's check solves the same equation by least squares with
the training images as the points (:func:`exhume.evaluation.residuals.known_start_residual`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.equations.kinds import SolvedEquation
from exhume.equations.stationarity import Objective
from exhume.equations.surrogate import soft_activations
from exhume.errors import ConfigError
from exhume.starts import frozen_names

EQUATIONS = (SolvedEquation.TRAJECTORY.value, SolvedEquation.ENDPOINTS.value)
PRECONDITIONERS = ("auto", "none", "state")


@dataclass
class StartEquation:
    """The known-start equation on a working copy of the victim (see the module docstring)."""

    names: tuple[str, ...]  # the parameters in the equation (trained ones)
    points: list[dict[str, torch.Tensor]]  # full parameter dicts at which gradients are taken
    target: dict[str, torch.Tensor]  # P ⊙ (θ_T − c·θ_0) over names (c = 0 where the start is unknown)
    direction: dict[str, torch.Tensor] | None  # P ⊙ θ_0 over names when c is fitted, else None
    norm2: float  # ‖target‖², or ‖target projected off direction‖² when c is fitted
    info: dict[str, Any] = field(default_factory=dict)
    shared: bool = False  # one multiplier per candidate for the mean of its gradients over the points

    @property
    def multipliers(self) -> int:
        """Multipliers per candidate: one per gradient point, or one when they are shared."""
        return 1 if self.shared else len(self.points)

    def decay(self, resid: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The fitted ``c`` for a residual before projection (None when ``c`` is not fitted)."""
        if self.direction is None:
            return None
        d2 = sum((self.direction[k] ** 2).sum() for k in self.names)
        return sum((self.direction[k] * resid[k]).sum() for k in self.names) / d2


#: preconditioner="auto" uses Adam's second moment only where at least this share of the start survives in θ_T
MIN_START_SURVIVAL = 0.5


def start_survival(params: dict[str, torch.Tensor], start: dict[str, torch.Tensor], names) -> float:
    """``⟨θ_T, θ_0⟩ / ‖θ_0‖²`` over the trained parameters with a known start: how much of the start is left."""
    known = [k for k in names if k in start]
    num = sum(float((params[k].double() * start[k].to(params[k].device).double()).sum()) for k in known)
    den = sum(float((start[k].double() ** 2).sum()) for k in known)
    return num / den if den > 0 else 0.0


#: start_equation="auto" solves the stationary equation where less than this share of the start survives in θ_T
FORGOTTEN_START = 0.1


def forgotten_start(model: nn.Module, start: dict[str, torch.Tensor]) -> str | None:
    """Why a known start is not used: training forgot it (``⟨θ_T, θ_0⟩/‖θ_0‖² < FORGOTTEN_START``; Adam's coupled
    weight decay at equilibrium), so θ_T depends on the data alone and the stationary equation, the ``T → ∞``
    limit, is the one to solve. None where the start survives or some parameter is frozen at it (the stationary
    equation would take a frozen extractor for trained). Measured: ``docs/defaults.md#audit-forgotten-start``."""
    if frozen_names(model, start):
        return None
    params = {k: v.detach() for k, v in model.named_parameters()}
    survival = start_survival(params, start, [k for k in params if k in start])
    if survival >= FORGOTTEN_START:
        return None
    return (f"the stationary equation: only {survival:.3f} of the start survives in the weights (< {FORGOTTEN_START:g}: training "
            "forgot it), so the weights depend on the data alone")


def _preconditioner(view, names, params, kind: str, survival: float) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Adam's ``√v̂ + ε`` where it applies. Adam's steps are preconditioned on their way; once training has
    forgotten its start (coupled weight decay at equilibrium: ``g + wθ ≈ 0``, which holds without ``P``),
    the final ``v̂`` only measures noise, so ``"auto"`` leaves it out where less than ``MIN_START_SURVIVAL``
    of the start survives."""
    moment = view.training.second_moment if view.training is not None else None
    if kind == "none" or (kind == "auto" and moment is None):
        return None, "none"
    if kind == "auto" and survival < MIN_START_SURVIVAL:
        return None, f"none: only {survival:.2f} of the start survives (training reached its equilibrium)"
    if moment is None:
        raise ConfigError("preconditioner 'state' needs Adam's second moment (training settings' second_moment, "
                          "the exp_avg_sq of the optimiser state)")
    missing = [k for k in names if k not in moment]
    if missing:
        raise ConfigError(f"the second moment lacks trained parameter {missing[0]!r}; expected Adam's exp_avg_sq of every one")
    s = view.training
    correction = 1.0 - s.betas[1] ** s.adam_step if s.adam_step else 1.0
    out = {k: (moment[k].to(params[k]).div(correction).sqrt() + s.eps) for k in names}
    return out, "adam second moment (√v̂ + ε)"


def start_decay_for(view, decay: Any, n: int) -> tuple[float | None, str]:
    """``c`` of the setting ``start_decay`` on ``view`` and its rule: a given number, the training settings' where they
    fix it ('auto'), else None (fitted)."""
    if decay == "fit":
        return None, "fitted"
    if decay != "auto":
        return float(decay), "given"
    c = view.training.decay(n) if view.training is not None else None
    return (c, "from the training settings") if c is not None else (None, "fitted")


def build_equation(view, model: nn.Module, params: dict[str, torch.Tensor], equation: str, n: int, decay: Any = "auto",
                   preconditioner: str = "auto", unknown: dict[str, torch.Tensor] | None = None) -> StartEquation:
    """The equation for ``view`` (with a start) on the working copy ``model``/``params`` (its device and dtype).

    ``unknown``: the weights-only target of parameters whose start is unknown (default: their weights).
    """
    if equation not in EQUATIONS:
        raise ConfigError(f"unknown equation {equation!r}; known: {', '.join(EQUATIONS)}")
    if view.start is None and equation != "trajectory":
        raise ConfigError(f"equation {equation!r} needs the starting weights (start=...)")
    start = {k: v.to(params[k]) for k, v in (view.start or {}).items()}
    frozen = set(frozen_names(model, start))
    names = tuple(k for k in params if k not in frozen)
    if not names:
        raise ConfigError("every parameter equals its start: nothing was trained")
    c, c_rule = start_decay_for(view, decay, n)
    survival = start_survival(params, start, names)
    p, p_rule = _preconditioner(view, names, params, preconditioner, survival)
    target, direction = {}, {}
    for k in names:
        scale = p[k] if p is not None else 1.0
        base = (unknown or {}).get(k, params[k]) if k not in start else params[k]
        target[k] = scale * (base - (c or 0.0) * start[k]) if k in start else scale * base
        direction[k] = scale * start[k] if k in start else torch.zeros_like(params[k])
    at_start = {k: start.get(k, v) for k, v in params.items()}
    points = [params] if equation == "trajectory" else [at_start, params]
    eq = StartEquation(names, points, target, direction if c is None and start else None, 0.0)  # no start: no c to fit
    eq.norm2 = float(sum((r ** 2).sum() for r in _project(eq, target).values()))
    eq.info = {"equation": equation, "start_decay": c, "start_decay_rule": c_rule, "preconditioner": p_rule, "start_survival": survival,
               "frozen_parameters": sorted(frozen), "start_unknown_parameters": sorted(k for k in names if k not in start),
               "equation_parameters": int(sum(params[k].numel() for k in names)), "gradient_points": len(points)}
    return eq


def _project(eq: StartEquation, resid: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    c = eq.decay(resid)
    return resid if c is None else {k: resid[k] - c * eq.direction[k] for k in eq.names}


def weighted_gradients(model: nn.Module, eq: StartEquation, x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
                       alpha: float | None, objective: Objective) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(Σ_k Σ_j λ_jk ∇_θ h(θ^(k); x̂_j), h at the last point)`` over the equation's parameters; ``lam`` is ``(m, K)``."""
    total: dict[str, torch.Tensor] = {}
    h_last = None
    for k, point in enumerate(eq.points):
        rest = {n: v for n, v in point.items() if n not in eq.names}

        def weighted(sub, k=0 if eq.shared else k, rest=rest):
            h = objective(functional_call(model, {**rest, **sub}, (x,)), y)
            return (lam[:, k] * h).sum(), h

        with soft_activations(alpha):
            g, h_last = grad(weighted, has_aux=True)({n: point[n] for n in eq.names})
        total = g if not total else {n: total[n] + g[n] for n in eq.names}
    return total, h_last


def start_residual(model: nn.Module, eq: StartEquation, x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
                   alpha: float | None, objective: Objective) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖target − Σ λ ∇h − c·direction‖², h)``, ``c`` fitted in closed form where it is free (differentiable)."""
    g, h = weighted_gradients(model, eq, x, y, lam, alpha, objective)
    resid = _project(eq, {k: eq.target[k] - g[k] for k in eq.names})
    return sum((r ** 2).sum() for r in resid.values()), h


def per_sample(model: nn.Module, eq: StartEquation, x: torch.Tensor, y: torch.Tensor, objective: Objective) -> torch.Tensor:
    """Every point's ``∇_θ h`` at every gradient point, flattened over the equation's parameters: ``(m·K, P)``."""
    rows = []
    for point in eq.points:
        rest = {n: v for n, v in point.items() if n not in eq.names}

        def one(xj, yj, rest=rest, point=point):
            def h(sub):
                return objective(functional_call(model, {**rest, **sub}, (xj[None],)), yj[None]).sum()

            g = grad(h)({n: point[n] for n in eq.names})
            return torch.cat([g[n].reshape(-1) for n in eq.names])

        rows.append(torch.func.vmap(one)(x, y))
    return torch.stack(rows).sum(0) if eq.shared else torch.cat(rows)


#: the multiplier scale S = ‖target‖ / (γ·√n) is multiplied by this (γ: a probe image's gradient norm)
SCALE_FACTOR = 1.0
PROBES = 16


def probe_images(mean: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """Centred binary images drawn pixel by pixel with the data mean as probability: data-like inputs from the mean alone."""
    gen = torch.Generator().manual_seed(seed)
    p = mean.detach().double().clamp(0.0, 1.0).cpu()
    draws = (torch.rand(count, *p.shape, generator=gen, dtype=torch.float64) < p).double()
    return (draws - p).to(mean.device, mean.dtype)


def multiplier_scale(model: nn.Module, eq: StartEquation, mean: torch.Tensor, labels: torch.Tensor, objective: Objective,
                     n: int) -> tuple[float, dict[str, Any]]:
    """``S`` in ``λ = S·u``: what ``n`` candidates of a data-like gradient norm ``γ`` need, ``‖target‖/(γ·√n)``.

    ``γ``: the root-mean-square norm of ``∇_θ h`` at the last gradient point over ``PROBES`` probe
    images (:func:`probe_images`), labelled like the first candidates. Weights and the mean only.
    """
    x = probe_images(mean, PROBES)
    last = StartEquation(eq.names, eq.points[-1:], eq.target, None, eq.norm2)
    labels = labels.repeat(math.ceil(PROBES / max(1, len(labels))))[:PROBES]
    rows = per_sample(model, last, x, labels.to(mean.device), objective)
    gamma = float(rows.double().pow(2).sum(1).mean().sqrt())
    s = SCALE_FACTOR * math.sqrt(eq.norm2) / (max(gamma, 1e-30) * math.sqrt(n))
    return s, {"lambda_scale_rule": "known start: S = ‖target‖/(γ·√n), γ the gradient norm of probe images drawn from the "
               "data mean", "probe_gradient_norm": gamma}


def nuclear_decay(w: torch.Tensor, w0: torch.Tensor, steps: int = 40) -> float:
    """``c`` in ``[0, 1.2]`` minimising the nuclear norm of ``W_T − c·W_0`` (convex in ``c``; golden section).

    Gradient descent adds to a layer that the input enters through only rows in the training
    inputs' span, a low-rank matrix; the decayed start is full rank, so the right ``c`` leaves the
    lowest nuclear norm.
    """
    w, w0 = w.detach().double().cpu(), w0.detach().double().cpu()

    def cost(c: float) -> float:
        return float(torch.linalg.svdvals(w - c * w0).sum())

    lo, hi, phi = 0.0, 1.2, (math.sqrt(5) - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = cost(a), cost(b)
    for _ in range(steps):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = cost(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = cost(b)
    return 0.5 * (lo + hi)


def added_inputs_layer(eq: StartEquation, params: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
                       input_dim: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``params`` with each trained 2-D parameter of ``input_dim`` columns replaced by what training added to it.

    ``W_T − c·W_0``, with the equation's ``c`` where it is fixed, else :func:`nuclear_decay`'s: its
    row space is the training inputs' span (read by :func:`exhume.attacks.kkt.subspace.data_subspace`).
    """
    out, info = dict(params), {}
    for k in eq.names:
        w = params[k]
        if k in start and w.dim() == 2 and w.shape[1] == input_dim:
            c = eq.info.get("start_decay")
            c = nuclear_decay(w, start[k]) if c is None else float(c)
            out[k] = w - c * start[k].to(w)
            info[f"subspace_start_decay[{k}]"] = c
    return out, info

