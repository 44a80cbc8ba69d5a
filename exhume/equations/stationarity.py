"""The stationarity residual ``θ − Σ_j λ_j ∇_θ margin_j`` for any ``nn.Module``, through torch.func.

``Σ_j λ_j ∇_θ margin(Φ(θ; x̂_j), ŷ_j)`` is the gradient in ``θ`` of the scalar
``Σ_j λ_j margin_j``, so one vector-Jacobian product gives the whole sum (no per-sample
gradients). The residual stays differentiable in ``x̂`` and ``λ``: the gradient keeps its graph and
the residual is differentiated through it (a double backward). :class:`TracedResidual` records that
double backward once as a graph of tensor operations and replays it (the same numbers without
autograd's and torch.func's per-operation costs).

Least squares on gradient rows (:func:`least_squares`, :func:`gram_least_squares`), signed or
bounded, serve kkt's closed-form multipliers, the known-start equation's fitted start share and the
evaluator's checks; the bounded solve runs under ``torch.func.vmap`` as well (:func:`bounded_solve`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.equations.surrogate import soft_activations
from exhume.losses import margin, per_sample_loss

#: per-sample scalar h_j(Φ(x̂_j), ŷ_j) whose parameter gradients are summed with weights λ_j
Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def output_objective(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``Φ(x̂_j)`` itself (scalar-output regression: ``θ = Σ_j λ_j ∇_θ Φ(x̂_j)``, λ signed)."""
    return out.reshape(out.shape[0], -1).sum(1)


def negative_loss_objective(loss: str) -> Objective:
    """``−ℓ(Φ(x̂_j), ŷ_j)``: with weight decay ``w``, ``θ = (1/(n·w)) Σ_i −∇_θ ℓ_i`` exactly (Buzaglo et al.)."""

    def objective(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -per_sample_loss(loss, out, y)

    return objective


def weighted_gradient_and_objective(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
    alpha: float | None = None, objective: Objective = margin,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(Σ_j λ_j ∇_θ h_j, h)``: the weighted gradient and the per-candidate ``h_j`` from the same forward pass.

    ``h`` has its exact value (the surrogate changes derivatives only) and is differentiable in ``x``
    (through the surrogate derivative, like the gradient).
    """

    def weighted(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h = objective(functional_call(model, p, (x,)), y)
        return (lam * h).sum(), h

    with soft_activations(alpha):
        return grad(weighted, has_aux=True)(params)


def stationarity_residual(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
    alpha: float | None = None, objective: Objective = margin, target: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``‖θ − Σ_j λ_j ∇_θ h_j‖²``, summed over every parameter tensor (``h`` the margin by default).

    ``target`` replaces ``θ`` on the left (the network is still evaluated at ``params``): e.g. the weights'
    learned part (:func:`exhume.equations.span.learned_part`).
    """
    return stationarity_residual_and_objective(model, params, x, y, lam, alpha, objective, target)[0]


def stationarity_residual_and_objective(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
    alpha: float | None = None, objective: Objective = margin, target: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖θ − Σ_j λ_j ∇_θ h_j‖², h)``, ``h`` the per-candidate objective of the same forward pass."""
    g, h = weighted_gradient_and_objective(model, params, x, y, lam, alpha, objective)
    t = params if target is None else target
    return sum(((t[k] - g[k]) ** 2).sum() for k in params), h


class _WithGradients(torch.autograd.Function):
    """``value`` whose gradients in ``x`` and ``λ`` are the given ``gx`` and ``gλ`` (computed elsewhere)."""

    @staticmethod
    def forward(ctx, value, x, lam, gx, glam):  # noqa: ANN001, ANN205
        ctx.save_for_backward(gx, glam)
        return value.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        gx, glam = ctx.saved_tensors
        return None, grad * gx, grad * glam, None, None


def residual_value_and_gradients(model: nn.Module, objective: Objective, alpha: float | None):
    """``(x, λ, θ, t, y) -> (‖t − g‖², h, ∂/∂x, ∂/∂λ)``, the double backward as a function of tensors alone."""

    def value(x, lam, params, target, y):  # noqa: ANN001, ANN202
        g, h = weighted_gradient_and_objective(model, params, x, y, lam, alpha, objective)
        return sum(((target[k] - g[k]) ** 2).sum() for k in params), h

    def f(x, lam, params, target, y):  # noqa: ANN001, ANN202
        (gx, glam), (v, h) = torch.func.grad_and_value(value, argnums=(0, 1), has_aux=True)(x, lam, params, target, y)
        return v, h, gx, glam

    return f


def replay_agrees(got, ref) -> bool:
    """Whether a traced graph's outputs ``got`` equal the eager ``ref`` to rounding (1e-4 relative in float32 and below,
    1e-9 in float64, against each output's largest finite entry); a diverged step must agree too (NaN, inf)."""
    tol = 1e-4 if ref[0].dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-9
    for a, b in zip(got, ref):
        scale = float(torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0).abs().max())
        if not torch.allclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True):
            return False
    return True


class TracedResidual:
    """:func:`stationarity_residual_and_objective` traced once into a graph of tensor operations, replayed.

    ``make_fx`` (fake tensors) records the operations of the double backward, value and gradients in
    ``x`` and ``λ`` together; each call replays them without autograd's bookkeeping or torch.func's
    dispatch: the same numbers, fewer milliseconds. The returned value carries those gradients
    (:class:`_WithGradients`); ``h`` comes back without a graph, so a caller that differentiates ``h``
    must use the eager function. A module that cannot be traced (control flow on tensor values) or
    whose replay disagrees with the eager path on the first call is left to the eager path, which
    also serves calls without a graph to build; ``info`` (a dict, updated in place) says which.
    """

    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self.graph, self.key, self.failed = None, None, False
        self.info = {} if info is None else info
        self.info.update(residual_traced=False, residual_trace_note="not traced yet")

    def __call__(self, model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                 lam: torch.Tensor, alpha: float | None = None, objective: Objective = margin,
                 target: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        t = params if target is None else target
        key = (x.shape, lam.shape, y.shape, x.dtype, x.device, model, objective, alpha,
               tuple((k, v.shape) for k, v in params.items()), tuple((k, t[k].shape) for k in params))
        if self.failed or not (torch.is_grad_enabled() and (x.requires_grad or lam.requires_grad)):
            return stationarity_residual_and_objective(model, params, x, y, lam, alpha, objective, target)
        args = (x.detach(), lam.detach(), params, t, y)
        if key != self.key:
            self.graph, self.key = self._trace(residual_value_and_gradients(model, objective, alpha), args), key
            if self.graph is None:
                return stationarity_residual_and_objective(model, params, x, y, lam, alpha, objective, target)
        value, h, gx, glam = self.graph(*args)
        return _WithGradients.apply(value, x, lam, gx, glam), h

    def _trace(self, f, args):  # noqa: ANN001, ANN202
        """The traced graph, checked against the eager path once; None (and why, in :attr:`info`) if it cannot be."""
        from torch.fx.experimental.proxy_tensor import make_fx

        try:
            graph = make_fx(f, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
        except Exception as err:  # noqa: BLE001 - any failure to trace leaves the module to the eager path
            self.failed = True
            self.info.update(residual_trace_note=f"eager: the module cannot be traced ({type(err).__name__})")
            return None
        got, ref = graph(*args), f(*args)
        if not replay_agrees((got[0], got[2], got[3]), (ref[0], ref[2], ref[3])):  # h is not compared
            self.failed = True
            self.info.update(residual_trace_note="eager: the traced graph disagreed with the eager path")
            return None
        self.info.update(residual_traced=True, residual_trace_note="traced once, replayed every step")
        return graph


def homogeneity_degree(model: nn.Module, params: dict[str, torch.Tensor], input_shape, dtype, seed: int = 0) -> float:
    """Estimate ``L`` in ``⟨θ, ∇_θ Φ(x)⟩ = L·Φ(x)`` (exact for bias-free ReLU nets: their depth).

    Measured on random inputs, it is what an attacker can compute from the weights alone; for
    networks that are not homogeneous it is an average, used only to set a scale.
    """
    gen = torch.Generator().manual_seed(seed)
    device = next(iter(params.values())).device
    x = torch.randn(16, *input_shape, generator=gen, dtype=dtype).to(device)

    def total(p):
        out = functional_call(model, p, (x,))
        return out.reshape(out.shape[0], -1)[:, 0]

    out = total(params)
    jvp_out = torch.func.jvp(total, (params,), ({k: v for k, v in params.items()},))[1]
    ratio = (jvp_out.abs().sum() / out.abs().sum().clamp_min(1e-30)).item()
    return float(min(max(ratio, 1.0), 10.0))


def per_candidate_gradients(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    objective: Objective = margin, alpha: float | None = None,
) -> torch.Tensor:
    """``∇_θ h_j`` of every candidate, flattened over the parameters in ``params``' order: (m, P)."""

    def one(xj: torch.Tensor, yj: torch.Tensor) -> torch.Tensor:
        def h(p):
            return objective(functional_call(model, p, (xj[None],)), yj[None]).sum()

        g = grad(h)(params)
        return torch.cat([g[k].reshape(-1) for k in params])

    with soft_activations(alpha):
        return torch.func.vmap(one)(x, y)


def least_squares(J: torch.Tensor, t: torch.Tensor, nonnegative: bool = False, free: int = 0, ridge: float = 1e-12) -> torch.Tensor:
    """``argmin_c ‖t − Jᵀc‖² + ε‖c‖²`` for rows ``J`` ``(k, P)`` and ``t`` ``(P,)``, in ``J``'s dtype.

    Solved through the ``k × k`` Gram matrix ``A = JJᵀ`` (``v = Jt``) by :func:`gram_least_squares`. Shared by
    the evaluator's checks, the known-start equation and kkt's closed-form multipliers.
    """
    return gram_least_squares(J @ J.T, J @ t, nonnegative, free, ridge)


def gram_least_squares(gram: torch.Tensor, b: torch.Tensor, nonnegative: bool = False, free: int = 0,
                       ridge: float = 1e-12) -> torch.Tensor:
    """``argmin_c ‖t − Jᵀc‖² + ε‖c‖²`` from ``gram = JJᵀ`` and ``b = Jt`` alone (signed: ``c = (A + εI)⁻¹b``).

    ``ε = ridge × mean(diag A)``. ``nonnegative``: ``c ≥ 0`` except the last ``free`` coefficients (bounded least
    squares, scipy's BVLS, on the Cholesky factor of ``A + εI``); for callers that accumulate the Gram matrix in blocks.
    """
    gram = gram + ridge * gram.diagonal().mean().clamp_min(1e-300) * torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    if not nonnegative:
        return torch.linalg.solve(gram, b)
    chol = torch.linalg.cholesky(gram)
    rhs = torch.linalg.solve_triangular(chol, b[:, None], upper=False)[:, 0]
    return bounded_solve(chol.mT.detach(), rhs.detach(), free)  # no derivative flows through the solve


@torch.library.custom_op("exhume::bounded_solve", mutates_args=())
def bounded_solve(a: torch.Tensor, b: torch.Tensor, free: int) -> torch.Tensor:
    """``argmin_{c ≥ 0} ‖a·c − b‖`` except the last ``free`` coefficients (unbounded): scipy's BVLS, in ``b``'s dtype.

    A custom operator, so that a vmapped caller (the batched restarts) solves each problem of its batch in turn
    (:func:`_bounded_solve_vmap`) and a traced one records it as one node; no derivative flows through it."""
    import numpy as np
    from scipy.optimize import lsq_linear

    lo = np.zeros(a.shape[1])
    lo[a.shape[1] - free:] = -np.inf
    got = lsq_linear(a.cpu().double().numpy(), b.cpu().double().numpy(), bounds=(lo, np.inf), method="bvls").x
    return torch.as_tensor(got, dtype=b.dtype, device=b.device)


@bounded_solve.register_fake
def _bounded_solve_shape(a: torch.Tensor, b: torch.Tensor, free: int) -> torch.Tensor:
    return b.new_empty(a.shape[1])


def _bounded_solve_vmap(info, in_dims, a: torch.Tensor, b: torch.Tensor, free: int):  # noqa: ANN001, ANN202
    """:func:`bounded_solve` over a batch: one solve per problem."""
    a_dim, b_dim, _ = in_dims
    size = info.batch_size
    a = a.movedim(a_dim, 0) if a_dim is not None else a.expand(size, *a.shape)
    b = b.movedim(b_dim, 0) if b_dim is not None else b.expand(size, *b.shape)
    return torch.stack([bounded_solve(a[k], b[k], free) for k in range(size)]), 0


bounded_solve.register_vmap(_bounded_solve_vmap)
