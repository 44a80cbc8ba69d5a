"""Which stationarity equation a victim satisfies, and the scale of its multipliers.

Four forms of ``θ = Σ_j λ_j ∇_θ h(Φ(θ; x̂_j), ŷ_j)`` (docs/METHODS.md §1):

- ``margin``: ``h`` = the margin (``y·Φ`` binary, ``Φ_y − max_{k≠y} Φ_k`` multiclass), λ ≥ 0: Haim
  et al.'s KKT conditions and Buzaglo et al.'s multiclass version; with weight decay exact for the
  logistic loss (``λ_i = σ(−margin_i)/(n·w)``), not for cross-entropy.
- ``soft-margin``: ``h = Φ_y − log Σ_{k≠y} exp Φ_k`` (:func:`exhume.losses.soft_margin`; the margin
  for binary victims), λ ≥ 0. ``−∇_θℓ_CE = σ(−h)·∇_θh``, so with weight decay it is exact for
  cross-entropy (``λ_i = σ(−h_i)/(n·w)``); it memorised about twice as many training images as
  ``margin`` on 10-class victims (``docs/defaults.md#kkt-formulation``).
- ``loss``: ``h = −ℓ(Φ, ŷ)``, λ ≥ 0. Exact for *any* loss at a stationary point of
  ``mean_i ℓ_i + (w/2)‖θ‖²``: ``θ = (1/(n·w)) Σ_i −∇_θ ℓ_i``, so every training point has
  ``λ = 1/(n·w)``.
- ``output``: ``h = Φ`` (scalar-output regression), λ signed with no lower bound: with the
  squared loss ``λ_i = −(Φ_i − y_i)/(n·w)``; the targets are unknown, so the residuals are the
  unknowns.

``auto`` picks ``output`` for regression, ``soft-margin`` for multiclass victims trained with
cross-entropy or of unknown loss, and ``margin`` otherwise.

The scale ``S`` (``λ = S·u``, ``u`` optimised): a homogeneous network trades the scale of ``λ``
against that of ``x̂``, so a wrong ``S`` shrinks every candidate towards the mean (too large) or
costs iterations (too small). Estimated from the weights alone with Euler's identity
``⟨θ, ∇_θΦ(x)⟩ = L·Φ(x)``, so ``Σ_i λ_i·margin_i = ‖θ‖²/L`` (:func:`lambda_scale`). With weight
decay the margins follow from the weights (``σ(−m*)·m* = w‖θ‖²/L``); without it they do not, and
``S = ‖θ‖²/(L·n·q₀)``, the multiplier of ``n`` training points at margin ``q₀ = NO_DECAY_MARGIN``,
an assumption the evaluator checks against the real margins
(:func:`exhume.evaluation.assumptions.scale_failure`; pass ``lambda_scale=`` to override it). Why
this rule: ``docs/defaults.md#kkt-lambda_scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from exhume.equations.stationarity import Objective, homogeneity_degree, negative_loss_objective, output_objective
from exhume.equations.workcopy import remembered
from exhume.errors import ConfigError
from exhume.losses import margin, soft_margin, weighs_by_soft_margin

FORMULATIONS = ("auto", "margin", "soft-margin", "loss", "output")
MARGIN_FORMS = ("margin", "soft-margin")  # the forms whose h is a classifier's margin (λ ≥ 0)
AUTO_SCALE_FACTOR = 5.0 / 3.0  # with weight decay; measured on the demo victim (docs/defaults.md, kkt: lambda_scale)
# Without weight decay the training margins are not tied to the weights, so S assumes margin q₀.
# Chosen on the zoo's two Haim victims (docs/defaults.md, kkt: lambda_scale).
NO_DECAY_MARGIN = 30.0


@dataclass
class Formulation:
    name: str
    objective: Objective
    signed: bool  # λ signed, no dual-feasibility penalty
    labels: torch.Tensor
    scale: float
    info: dict[str, Any] = field(default_factory=dict)


def typical_margin(target: float) -> float:
    """Solve ``σ(−m)·m = target`` for the larger root (fitted points), ``m ≥ 1.278``."""
    peak_m = 1.2785
    if target >= peak_m / (1.0 + math.exp(peak_m)):
        return peak_m
    lo, hi = peak_m, 60.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if mid / (1.0 + math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def binary_labels(m: int, dtype: torch.dtype) -> torch.Tensor:
    """Half the candidates labelled +1, half −1 (fixed, not learned)."""
    return candidate_labels("binary", m, None, dtype)


def candidate_labels(task: str, m: int, num_classes: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Fixed labels: binary half +1 / half −1; multiclass spread evenly; regression unused zeros."""
    if task == "binary":
        return torch.cat([torch.ones(m - m // 2), -torch.ones(m // 2)]).to(dtype)
    if task == "multiclass":
        if not num_classes or num_classes < 2:
            raise ConfigError("a multiclass victim needs num_classes >= 2 in its metadata")
        return torch.arange(m) % int(num_classes)
    return torch.zeros(m, dtype=dtype)


def theta_squared(params) -> float:
    """``‖θ‖²`` in double precision, over all parameter tensors."""
    return float(sum((p.double() ** 2).sum() for p in params.values()))


def lambda_scale(form: str, loss: str | None, wd: float, model, params, input_shape, n: int, dtype,
                 victim: nn.Module | None = None) -> tuple[float, dict]:
    """``S`` from the weights alone (no training data), with the rule used (``victim``: the module ``model`` copies,
    whose ``‖θ‖²`` and degree are then computed once, :func:`exhume.equations.workcopy.remembered`)."""
    theta2 = remembered(victim, params, "theta_squared", lambda: theta_squared(params))
    if form == "loss":
        if wd <= 0:
            raise ConfigError("formulation 'loss' needs the weight decay the victim was trained with (weight_decay > 0)")
        return 1.0 / (n * wd), {"lambda_scale_rule": "loss form: S = 1/(n·wd), exact at a stationary point"}
    shape = tuple(int(d) for d in input_shape)
    degree = remembered(victim, params, ("homogeneity_degree", shape), lambda: homogeneity_degree(model, params, shape, dtype))
    if form == "output":
        typical = theta2 / (degree * n)
        return typical, {"lambda_scale_rule": "output form: S = ‖θ‖²/(L·n) (Euler, outputs of order 1)",
                         "homogeneity_degree": degree}
    if wd <= 0:
        typical = theta2 / (degree * n * NO_DECAY_MARGIN)
        return typical, {"lambda_scale_rule": f"no weight decay: S = ‖θ‖²/(L·n·q₀), q₀ = {NO_DECAY_MARGIN:g}",
                         "homogeneity_degree": degree, "assumed_margin": NO_DECAY_MARGIN, "theta_squared": theta2}
    m_star = typical_margin(wd * theta2 / degree)
    typical = 1.0 / (1.0 + math.exp(m_star)) / (n * wd)
    return AUTO_SCALE_FACTOR * typical, {
        "lambda_scale_rule": "auto: (5/3) × σ(−m*)/(n·wd), σ(−m*)·m* = wd·‖θ‖²/L",
        "homogeneity_degree": degree, "typical_margin": m_star, "typical_lambda": typical,
    }


def auto_form(task: str, loss: str | None) -> str:
    """``formulation="auto"`` for a victim's task kind and training loss (None: unknown)."""
    if task == "regression":
        return "output"
    if weighs_by_soft_margin(task, loss):
        return "soft-margin"
    return "margin"


def form_for(view, form: str = "auto") -> str:
    """The formulation a run with ``formulation=form`` uses on ``view`` (with the victim's loss, the view's)."""
    return auto_form(view.task, view.loss) if form == "auto" else form


def objective_for(form: str, loss: str | None, task: str) -> Objective:
    """The ``h`` of formulation ``form`` (resolved, not ``auto``) for a victim of ``task`` trained with ``loss``."""
    if form in MARGIN_FORMS:
        if task == "regression":
            raise ConfigError(f"a regression victim has no margin (formulation {form!r}); use formulation 'output' or 'loss'")
        return margin if form == "margin" else soft_margin
    if form == "output":
        return output_objective
    if loss is None:
        raise ConfigError("formulation 'loss' needs the victim's training loss; state it in the threat model "
                          "(ThreatModel(loss=...), exhume.attack(loss=...), --loss NAME)")
    if task == "regression" and loss == "squared":
        raise ConfigError("regression targets are unknown to the attacker: use formulation 'output' for squared-loss regression")
    return negative_loss_objective(loss)


def resolve(view, model: nn.Module, form: str, scale: Any, params, n: int, m: int, dtype: torch.dtype) -> Formulation:
    """Pick the equation for ``view`` (an AttackerView: its task, loss and weight decay) and the attack's settings;
    ``model`` and ``params`` are the attack's working copy (its device and dtype)."""
    if form not in FORMULATIONS:
        raise ConfigError(f"unknown formulation {form!r}; known: {', '.join(FORMULATIONS)}")
    form, loss, wd = form_for(view, form), view.loss, float(view.weight_decay or 0.0)
    objective = objective_for(form, loss, view.task)
    labels = candidate_labels(view.task, m, view.num_classes, dtype)
    if scale == "auto":
        s, info = lambda_scale(form, loss, wd, model, params, view.input_shape, n, dtype, victim=view.model)
    else:
        s, info = float(scale), {"lambda_scale_rule": "given"}
        if form in MARGIN_FORMS and wd <= 0:  # for the evaluator's check of the scale (evaluation.assumptions.scale_failure)
            shape = tuple(int(d) for d in view.input_shape)
            info.update(homogeneity_degree=remembered(view.model, params, ("homogeneity_degree", shape),
                                                      lambda: homogeneity_degree(model, params, shape, dtype)),
                        theta_squared=remembered(view.model, params, "theta_squared", lambda: theta_squared(params)))
    return Formulation(name=form, objective=objective, signed=form == "output", labels=labels, scale=s,
                       info={"formulation": form, "loss_assumed": loss, "weight_decay_assumed": wd, **info})
