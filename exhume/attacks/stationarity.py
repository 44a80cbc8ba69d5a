"""The stationarity residual ``θ − Σ_j λ_j ∇_θ margin_j`` for any ``nn.Module``, through torch.func.

``Σ_j λ_j ∇_θ margin(Φ(θ; x̂_j), ŷ_j)`` is the gradient in ``θ`` of the scalar
``Σ_j λ_j margin_j``, so one vector-Jacobian product gives the whole sum (no per-sample
gradients). The residual stays differentiable in ``x̂`` and ``λ`` (double backward).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.attacks.surrogate import soft_activations
from exhume.losses import margin


def weighted_margin_gradient(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
    alpha: float | None = None,
) -> dict[str, torch.Tensor]:
    """``Σ_j λ_j ∇_θ margin_j`` as a dict shaped like ``params`` (differentiable in ``x``, ``λ``)."""

    def weighted(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return (lam * margin(functional_call(model, p, (x,)), y)).sum()

    with soft_activations(alpha):
        return grad(weighted)(params)


def stationarity_residual(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
    alpha: float | None = None,
) -> torch.Tensor:
    """``‖θ − Σ_j λ_j ∇_θ margin_j‖²``, summed over every parameter tensor."""
    g = weighted_margin_gradient(model, params, x, y, lam, alpha)
    return sum(((params[k] - g[k]) ** 2).sum() for k in params)


def homogeneity_degree(model: nn.Module, params: dict[str, torch.Tensor], input_shape, dtype, seed: int = 0) -> float:
    """Estimate ``L`` in ``⟨θ, ∇_θ Φ(x)⟩ = L·Φ(x)`` (exact for bias-free ReLU nets: their depth).

    Measured on random inputs, it is what an attacker can compute from the weights alone; for
    networks that are not homogeneous it is an average, used only to set a scale.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, *input_shape, generator=gen, dtype=dtype)

    def total(p):
        out = functional_call(model, p, (x,))
        return out.reshape(out.shape[0], -1)[:, 0]

    out = total(params)
    jvp_out = torch.func.jvp(total, (params,), ({k: v for k, v in params.items()},))[1]
    ratio = (jvp_out.abs().sum() / out.abs().sum().clamp_min(1e-30)).item()
    return float(min(max(ratio, 1.0), 10.0))
