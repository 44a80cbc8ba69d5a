"""The bilevel attack's lower level: reach a stationary point of ``E(x̂, ·)``, and read its spectrum.

Why: on a ReLU network the training objective's minimiser on a few candidates sits *on* the kinks, where ``∇E``
jumps, no point has ``∇E = 0`` and the implicit function theorem does not apply
(docs/usage.md#bilevel-reconstruction-and-the-initialisation-study). The lower level therefore replaces ReLU by
``softplus(β·z)/β`` (value *and* derivatives, :class:`exhume.equations.surrogate.smooth_activations`), a smooth victim
that tends to the ReLU one as ``β → ∞``, and solves it with :func:`newton_cg`, which drives ``‖∇E‖`` below a tolerance.

- :func:`newton_cg`: Levenberg–Marquardt-damped Newton with conjugate-gradient inner solves on
  Hessian-vector products (``H`` never formed), truncated on negative curvature (Steihaug), step
  accepted by the ratio of actual to predicted decrease; float64, warm-started by the caller.
- :func:`extreme_eigenvalues`: a few Lanczos iterations for ``λ_min``/``λ_max`` of ``H``, from which
  :func:`spectral_damping` picks the adjoint solve's ``δ`` (0 when ``H`` is positive definite).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Objective = Callable[[torch.Tensor], torch.Tensor]
#: ``stop()``: true once the caller's time budget is spent; the solvers then return what they have (flagged)
Stop = Callable[[], bool] | None


def _stopped(stop: Stop) -> bool:
    return stop is not None and stop()


def _grad_graph(f: Objective, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = theta.detach().clone().requires_grad_()
    value = f(t)
    (g,) = torch.autograd.grad(value, t, create_graph=True)
    return t, value.detach(), g


def _hvp_of(t: torch.Tensor, g: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    def hvp(v: torch.Tensor) -> torch.Tensor:
        (hv,) = torch.autograd.grad(g, t, grad_outputs=v, retain_graph=True)
        return hv.detach()
    return hvp


ROUNDING = 1e-13  # relative size of a change in the objective that its floating-point value cannot resolve


def _steihaug_cg(hvp, g: torch.Tensor, mu: float, iterations: int, rtol: float, stop: Stop = None) -> tuple[torch.Tensor, int]:
    """Approximately solve ``(H + μI) d = −g``; on negative curvature return the iterate so far
    (or ``−g`` if none), as in Steihaug's truncated CG; when ``stop()`` the iterate so far."""
    d = torch.zeros_like(g)
    r = -g.clone()
    p = r.clone()
    rr = r @ r
    enough = (rtol * float(g.norm())) ** 2
    for k in range(iterations):
        if k and _stopped(stop):
            return d, k
        hp = hvp(p) + mu * p
        curv = p @ hp
        if not torch.isfinite(curv) or curv <= 0:
            return (d if k else -g), k
        a = rr / curv
        d = d + a * p
        r = r - a * hp
        rr_new = r @ r
        if float(rr_new) <= enough:
            return d, k + 1
        p = r + (rr_new / rr) * p
        rr = rr_new
    return d, iterations


def _newton_loop(f: Objective, theta: torch.Tensor, tol: float, max_iter: int, cg_iterations: int,
                 mu: float, stop: Stop = None) -> tuple[torch.Tensor, dict[str, Any]]:
    hvps, it = 0, 0
    t, value, g = _grad_graph(f, theta)
    gnorm = float(g.detach().norm())
    for it in range(1, max_iter + 1):
        if gnorm <= tol or mu > 1e12 or _stopped(stop):
            it -= 1
            break
        hvp = _hvp_of(t, g)
        d, k = _steihaug_cg(hvp, g.detach(), mu, cg_iterations, min(0.5, gnorm ** 0.5), stop)
        hvps += k + 1
        if _stopped(stop):
            break
        predicted = -float(g.detach() @ d + 0.5 * (d @ hvp(d)))
        with torch.no_grad():
            new_value = f(theta + d)
        rho = float(value - new_value) / predicted if predicted > 0 else -1.0
        if torch.isfinite(new_value) and rho > 0.1:
            theta = (theta + d).detach()
            t, value, g = _grad_graph(f, theta)
            gnorm = float(g.detach().norm())
            mu = mu / 3 if rho > 0.75 else mu
        elif torch.isfinite(new_value) and abs(predicted) <= ROUNDING * max(1.0, abs(float(value))):
            # the predicted decrease is below the objective's rounding: the value cannot rank the step
            # (rho is noise there, and the damping would only grow); the gradient norm can
            t2, value2, g2 = _grad_graph(f, (theta + d).detach())
            if float(g2.detach().norm()) < gnorm:
                theta, t, value, g = (theta + d).detach(), t2, value2, g2
                gnorm = float(g.detach().norm())
            else:
                mu = max(mu * 4, 1e-8)
        else:
            mu = max(mu * 4, 1e-8)
    return theta, {"grad_norm": gnorm, "iterations": it, "hvps": hvps, "mu": mu, "value": float(value)}


def _escape(f: Objective, theta: torch.Tensor, value: float, lanczos: int, stop: Stop = None) -> torch.Tensor | None:
    """At a stationary point with a clearly negative eigenvalue (a saddle, e.g. collapsed ReLU units,
    where the implicit gradient vanishes), a step along its eigenvector that lowers ``f``; else None."""
    t, _, g = _grad_graph(f, theta)
    lam_min, lam_max, v = extreme_eigenvalues(_hvp_of(t, g), theta.numel(), theta, lanczos, vector=True, stop=stop)
    if lam_min >= -1e-6 * max(abs(lam_max), 1.0):
        return None
    v = -v if float(g.detach() @ v) > 0 else v
    for step in (1.0, 0.3, 0.1, 0.03, 0.01):
        with torch.no_grad():
            cand = theta + step * v
            if float(f(cand)) < value:
                return cand.detach()
    return None


def newton_cg(f: Objective, theta0: torch.Tensor, tol: float, max_iter: int, cg_iterations: int = 100,
              mu0: float = 1e-4, escapes: int = 3, lanczos: int = 20, stop: Stop = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Minimise ``f`` from ``theta0`` until ``‖∇f‖ ≤ tol`` (or ``max_iter`` Newton steps), then check
    the point is a minimum: up to ``escapes`` times, leave a saddle along its negative-curvature
    direction (``lanczos`` products) and solve again. ``stop()`` (checked every Hessian-vector
    product) ends it early with the iterate so far (``"stopped": True``).

    Returns ``θ`` and ``{"grad_norm", "iterations", "hvps", "converged", "mu", "escapes", "stopped"}``.
    """
    theta, info = _newton_loop(f, theta0.detach().clone(), tol, max_iter, cg_iterations, mu0, stop)
    total, hvps, done = info["iterations"], info["hvps"], 0
    while done < escapes and info["grad_norm"] <= tol and not _stopped(stop):
        moved = _escape(f, theta, info["value"], lanczos, stop)
        if moved is None or _stopped(stop):
            break
        done += 1
        theta, info = _newton_loop(f, moved, tol, max_iter, cg_iterations, mu0, stop)
        total, hvps = total + info["iterations"], hvps + info["hvps"] + lanczos
    info.update(iterations=total, hvps=hvps, converged=info["grad_norm"] <= tol, escapes=done, stopped=_stopped(stop))
    return theta, info


def extreme_eigenvalues(hvp: Callable[[torch.Tensor], torch.Tensor], dim: int, like: torch.Tensor,
                        iterations: int = 20, seed: int = 0, vector: bool = False, stop: Stop = None):
    """Lanczos estimates of ``(λ_min, λ_max)`` of the symmetric operator ``hvp`` (``iterations``
    products, full reorthogonalisation; Ritz values bound the spectrum from inside); with
    ``vector=True`` also the unit Ritz vector of ``λ_min``. ``stop()`` ends it after fewer products."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(dim, generator=gen, dtype=like.dtype).to(like.device)
    q = q / q.norm()
    basis, alphas, betas = [q], [], []
    for j in range(min(iterations, dim)):
        w = hvp(basis[-1])
        alphas.append(float(basis[-1] @ w))
        for b in basis:  # full reorthogonalisation (few vectors)
            w = w - (b @ w) * b
        beta = float(w.norm())
        if beta < 1e-12 * (abs(alphas[-1]) + 1.0) or j == iterations - 1 or _stopped(stop):
            break
        betas.append(beta)
        basis.append(w / beta)
    k = len(alphas)
    tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if k > 1:
        off = torch.tensor(betas[:k - 1], dtype=torch.float64)
        tri = tri + torch.diag(off, 1) + torch.diag(off, -1)
    ev, vecs = torch.linalg.eigh(tri)
    if not vector:
        return float(ev[0]), float(ev[-1])
    ritz = torch.stack(basis[:k], 1) @ vecs[:, 0].to(like.dtype).to(like.device)
    return float(ev[0]), float(ev[-1]), ritz / ritz.norm()


def spectral_damping(lam_min: float, lam_max: float, floor: float = 1e-6) -> float:
    """``δ`` for ``(H + δI) p = b``: 0 when ``H`` is safely positive definite (``λ_min > floor·λ_max``),
    else enough to lift the smallest eigenvalue to ``floor·λ_max`` above zero."""
    target = floor * max(abs(lam_max), 1e-12)
    return 0.0 if lam_min > target else target - lam_min
