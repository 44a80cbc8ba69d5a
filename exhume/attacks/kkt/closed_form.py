"""kkt's multipliers solved in closed form at every step: the coefficient-free loss.

With ``Φ`` the candidates' gradients ``∇_θ h(x̂_j)`` as rows and ``w`` the target (``θ`` for the
stationary equation, ``P ⊙ (θ_T − c·θ_0)`` with a known start, :mod:`exhume.equations.trajectory`),
the multipliers minimising ``‖w − Φᵀλ‖²`` leave the residual of ``w`` after its projection on the
span of the gradients::

    min_λ ‖w − Φᵀλ‖² / ‖w‖² = (‖w‖² − vᵀA⁻¹v) / ‖w‖²,    v = Φw,  A = ΦΦᵀ (+ a small ridge)

(Iurada, Bombari, Tommasi and Mondelli, "A Law of Data Reconstruction for Random Features (and
Beyond)", 2026). The candidates alone remain unknown: no multiplier scale, no multiplier learning
rate. ``λ`` is signed, or non-negative where the equation's sign holds (the margin forms: bounded
least squares, the start's ``c`` left free). Differentiated through the solve by the envelope
theorem: at the minimiser ``λ*`` the derivative of the minimum in ``x̂`` is that of
``‖w − Φ(x̂)ᵀλ*‖²`` at ``λ*`` held fixed, for the signed and the bounded solve alike (``λ*`` is
optimal over a set that does not depend on ``x̂``), so one solve without a graph and the usual
residual give the exact gradient (tests/test_closed_form.py checks it against autograd through the
explicit formula). The ridge ``ε = RIDGE·mean(diag A)`` is held fixed within a step. The solve runs
under ``torch.func.vmap`` too (the batched restarts, :mod:`exhume.portfolio.batched`).
"""

from __future__ import annotations

import torch
from torch import nn

from exhume.equations.stationarity import Objective, least_squares, per_candidate_gradients
from exhume.equations.surrogate import soft_activations
from exhume.equations.trajectory import StartEquation, per_sample, probe_images

#: the ridge, relative to the mean diagonal of ΦΦᵀ (duplicate gradients, e.g. a layer equal at both endpoints, stay solvable)
RIDGE = 1e-8


def gradient_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Objective, alpha: float | None,
                  eq: StartEquation | None = None, params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``Φ``: every candidate's ``∇_θ h`` with the attack's ReLU surrogate, ``(K·m, P)`` with a start (point by point),
    ``(m, P)`` without; differentiable in ``x``."""
    if eq is None:
        return per_candidate_gradients(model, params, x, y, objective, alpha)
    with soft_activations(alpha):
        return per_sample(model, eq, x, y, objective)


def closed_form_residual(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Objective, alpha: float | None,
                         nonnegative: bool, eq: StartEquation | None = None, params: dict[str, torch.Tensor] | None = None,
                         target: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min_λ ‖w − Φᵀλ‖², λ*)``: the value differentiable in ``x`` (envelope, module docstring), ``λ*`` ``(m, K)`` with a
    start, ``(m,)`` without; ``w`` the equation's target (``target``, default ``params``, without a start)."""
    J = gradient_rows(model, x, y, objective, alpha, eq, params)
    if eq is not None:
        t = torch.cat([eq.target[k].reshape(-1) for k in eq.names])
        free = [] if eq.direction is None else [torch.cat([eq.direction[k].reshape(-1) for k in eq.names])]
    else:
        t, free = torch.cat([(params if target is None else target)[k].reshape(-1) for k in params]), []
    rows = torch.cat([J.detach(), *(f[None] for f in free)]).double()
    coef = least_squares(rows, t.double(), nonnegative, free=len(free), ridge=RIDGE).to(J.dtype)
    rest = t - J.T @ coef[: len(J)]
    if free:  # the start's share c, fitted jointly and left free
        rest = rest - coef[-1] * free[0]
    m = x.shape[0]
    lam = coef[:m] if eq is None else coef[: len(J)].reshape(eq.multipliers, m).T.contiguous()
    return (rest ** 2).sum(), lam.detach()


def one_point(model: nn.Module, eq: StartEquation, mean: torch.Tensor, labels: torch.Tensor, objective: Objective) -> StartEquation:
    """``eq`` with its gradient points merged into the last one where every trained parameter's ``∇_θ h`` is the same at
    each (the trained parameters enter linearly, e.g. a readout on frozen features): checked on probe images drawn from the
    data mean (:func:`~exhume.equations.trajectory.probe_images`). The same span at half the cost; else ``eq`` itself.
    Used with learned multipliers too: ``Σ_k λ_jk ∇h_k(x̂_j)`` is then ``(Σ_k λ_jk)·∇h(x̂_j)``, one multiplier per point."""
    if len(eq.points) < 2:
        return eq
    x = probe_images(mean, 4)
    y = labels.repeat(4)[:4].to(mean.device)
    rows = per_sample(model, StartEquation(eq.names, eq.points, eq.target, None, eq.norm2, shared=False), x, y, objective)
    last = rows[-len(x):]
    if not all(torch.allclose(rows[k * len(x):(k + 1) * len(x)], last, rtol=1e-5, atol=1e-6 * float(last.abs().max()))
               for k in range(len(eq.points) - 1)):
        return eq
    info = {**eq.info, "gradient_points_used": f"1 of {len(eq.points)}: the trained parameters' gradients are the same at each"}
    return StartEquation(eq.names, eq.points[-1:], eq.target, eq.direction, eq.norm2, info, shared=eq.shared)
