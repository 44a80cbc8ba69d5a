"""kkt's loss terms at candidates ``x`` and multipliers ``u`` (the package docstring's loss), written once for the lone
step, the vmapped restarts of :mod:`exhume.portfolio.batched`, the snapshots' criterion and the result."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from exhume.attacks.engine.priors import range_penalty, tv_term
from exhume.attacks.kkt.closed_form import closed_form_residual
from exhume.attacks.kkt.problem import Problem
from exhume.attacks.kkt.stage import span_penalty
from exhume.equations.stationarity import stationarity_residual_and_objective
from exhume.equations.trajectory import start_residual


class Terms(NamedTuple):
    """The loss and its stationarity, dual and prior terms; ``lam``: the closed-form multipliers ``λ`` (None: learned)."""

    loss: torch.Tensor
    stat: torch.Tensor
    dual: torch.Tensor
    prior: torch.Tensor
    lam: torch.Tensor | None = None


def residual(p: Problem, x: torch.Tensor, u: torch.Tensor, alpha: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖what the equation leaves‖², h)`` at candidates ``x`` and multipliers ``λ = S·u`` (not yet relative)."""
    if p.eq is not None:
        return start_residual(p.model, p.eq, x, p.y, p.form.scale * u, alpha, p.form.objective)
    return stationarity_residual_and_objective(p.model, p.params, x, p.y, p.form.scale * u, alpha, p.form.objective, p.target)


def terms(cfg: dict[str, Any], p: Problem, x: torch.Tensor, u: torch.Tensor, stationarity=None) -> Terms:
    """The loss at ``(x, u)`` with the settings ``cfg`` (``stationarity``: the stationarity function of the stationary
    equation, default the eager :func:`~exhume.equations.stationarity.stationarity_residual_and_objective`; a
    :class:`~exhume.equations.stationarity.TracedResidual` replays it). ``u`` is never written."""
    lo, hi, shift = (0.0, 1.0, p.mean) if cfg["prior"] == "display" else (-1.0, 1.0, torch.zeros_like(p.mean))
    lam = None
    if p.closed:  # the multipliers solved in closed form; u is not used
        stat, lam = closed_form_residual(p.model, x, p.y, p.form.objective, cfg["alpha"], not p.form.signed, p.eq, p.params, p.target)
    elif p.eq is not None:  # the known-start equation: eager (its traced replay is not built)
        stat, _ = residual(p, x, u, cfg["alpha"])
    else:
        stat, _ = (stationarity or stationarity_residual_and_objective)(p.model, p.params, x, p.y, p.form.scale * u, cfg["alpha"],
                                                                        p.form.objective, p.target)
    stat = stat / p.norm2
    floor = cfg["lambda_min"] if p.eq is None else 0.0  # the known-start equation has no margin: λ ≥ 0 only
    dual = u.new_zeros(()) if p.form.signed or p.closed else (torch.relu(floor - u) ** 2).sum()
    v = x + shift
    prior = range_penalty(v, lo, hi)
    loss = stat + cfg["dual_weight"] * dual + cfg["prior_weight"] * prior
    if cfg["tv_weight"] > 0:
        loss = loss + cfg["tv_weight"] * tv_term(v)
    if p.penalty is not None:  # the features' distance to what training added one layer up (exhume/attacks/kkt/stage.py)
        loss = loss + p.penalty.weight * span_penalty(p.model, p.penalty, x)
    return Terms(loss, stat, dual, prior, lam)


def solved_u(p: Problem, lam: torch.Tensor) -> torch.Tensor:
    """``u`` of the closed-form multipliers ``λ = S·u``."""
    return lam / p.form.scale


def criterion(cfg: dict[str, Any], p: Problem):
    """The attacker-side criterion of a snapshot ``{"x", "u"}``: the attack's own loss (lower is better)."""

    def score(t: dict[str, torch.Tensor]) -> float:
        with torch.no_grad():
            return float(terms(cfg, p, t["x"], t["u"]).loss)

    return score
