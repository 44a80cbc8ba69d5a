"""Smooth surrogate gradients for piecewise-linear activations, for any ``nn.Module``.

The stationarity attacks differentiate ``∇_θ Φ(θ; x̂)`` with respect to ``x̂``. Through a ReLU that
is hopeless: its derivative is a step, whose own derivative is zero almost everywhere, so the loss
is flat in ``x̂``. Haim et al. keep ReLU's forward pass and replace its derivative by
``sigmoid(α·z)``. We do this without touching the user's module: inside :class:`soft_activations`,
every call of ``torch.relu`` / ``F.relu`` / ``nn.ReLU`` (in-place or not) and
``F.leaky_relu`` / ``nn.LeakyReLU`` returns :func:`soft_relu`: exactly ``relu(z)`` in value, with
``sigmoid(α·z)`` as its derivative (leaky: scaled into ``[slope, 1]``) in reverse and forward mode,
and that derivative's own derivative ``α·σ(α·z)·(1 − σ(α·z))`` in a double backward or a reverse
pass through a forward-mode one, under ``torch.func`` transforms (``grad``, ``jvp``, ``vmap``).
Large activations (a convolution's) go through one custom ``autograd.Function`` node, which costs
fewer passes over them; small ones through the composite ``relu(z).detach() + s(z) − s(z).detach()``,
``s = softplus(α·z)/α``, whose stock operations cost less than the node's Python overhead there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_RELUS = {torch.relu, torch.relu_, F.relu, F.relu_, torch.Tensor.relu, torch.Tensor.relu_}
_LEAKY = {F.leaky_relu, F.leaky_relu_, torch._C._nn.leaky_relu, torch._C._nn.leaky_relu_}


class _SoftReLU(torch.autograd.Function):
    """``relu(z)`` forward; ``sigmoid(α·z)`` as its derivative in backward and jvp (both differentiable)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, alpha: float) -> torch.Tensor:
        return z.clamp_min(0)  # what torch.relu computes, through an operation soft_activations leaves alone

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        z, alpha = inputs
        ctx.save_for_backward(z)
        ctx.save_for_forward(z)
        ctx.alpha = alpha

    @staticmethod
    def slope(ctx) -> torch.Tensor:  # noqa: ANN001
        (z,) = ctx.saved_tensors
        return torch.sigmoid(ctx.alpha * z)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        return grad * _SoftReLU.slope(ctx), None

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, _alpha_tangent) -> torch.Tensor:  # noqa: ANN001
        return tangent * _SoftReLU.slope(ctx)


#: below this many elements :func:`soft_relu` uses the composite: the one node's fixed cost under torch.func
#: (about 0.3 ms a step) outweighs the passes it saves (docs/defaults.md#constants-surrogate-node)
ONE_NODE_MIN_ELEMENTS = 1 << 16


def soft_relu(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """``relu(z)`` in value, ``sigmoid(α·z)`` in derivative (reverse and forward mode, any order).

    One autograd node (:func:`soft_relu_one_node`) for large activations, the composite below
    :data:`ONE_NODE_MIN_ELEMENTS` elements; the two have the same derivatives.
    """
    if z.numel() < ONE_NODE_MIN_ELEMENTS:
        return soft_relu_composite(z, alpha)
    return soft_relu_one_node(z, alpha)


def soft_relu_one_node(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`soft_relu` as one custom autograd node (fewer passes over the activations)."""
    return _SoftReLU.apply(z, float(alpha))


def soft_relu_composite(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`soft_relu` written with stock operations (the reference it is tested against).

    ``softplus`` is linear beyond ``α·z > 20``, so there its second derivative is 0 where
    :func:`soft_relu`'s is ``α·σ(1 − σ) < 2.1e-9·α``.
    """
    s = F.softplus(alpha * z) / alpha
    return torch.relu(z).detach() + (s - s.detach())


def soft_leaky_relu(z: torch.Tensor, alpha: float, slope: float = 0.01) -> torch.Tensor:
    """``leaky_relu(z, slope)`` in value, ``slope + (1 − slope)·sigmoid(α·z)`` in derivative."""
    return slope * z + (1.0 - slope) * soft_relu(z, alpha)


class soft_activations(TorchFunctionMode):  # noqa: N801 - used as a context manager
    """Context manager: ReLU-family activations get the ``sigmoid(α·z)`` derivative inside it.

    ``alpha=None`` (or ``inf``) leaves every activation untouched.
    """

    def __init__(self, alpha: float | None) -> None:
        super().__init__()
        self.alpha = None if alpha is None or alpha == float("inf") else float(alpha)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if self.alpha is not None:
            if func in _RELUS:
                return soft_relu(args[0], self.alpha)
            if func in _LEAKY:
                slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
                return soft_leaky_relu(args[0], self.alpha, float(slope))
        return func(*args, **kwargs)


class smooth_activations(TorchFunctionMode):  # noqa: N801 - used as a context manager
    """Context manager: ReLU-family activations become ``softplus(β·z)/β`` in value *and* derivatives
    (leaky: ``slope·z + (1 − slope)·softplus(β·z)/β``), a smooth model that tends to the original as
    ``β → ∞`` (the gap is at most ``log 2 / β`` per unit). ``beta=None`` leaves them untouched.
    Used by the bilevel attack's lower level, which needs a stationary point to exist."""

    def __init__(self, beta: float | None) -> None:
        super().__init__()
        self.beta = None if beta is None or beta == float("inf") else float(beta)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if self.beta is not None:
            if func in _RELUS:
                return F.softplus(self.beta * args[0]) / self.beta
            if func in _LEAKY:
                slope = float(args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01))
                return slope * args[0] + (1.0 - slope) * F.softplus(self.beta * args[0]) / self.beta
        return func(*args, **kwargs)
