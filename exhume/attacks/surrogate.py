"""Smooth surrogate gradients for piecewise-linear activations, for any ``nn.Module``.

The stationarity attacks differentiate ``∇_θ Φ(θ; x̂)`` with respect to ``x̂``. Through a ReLU that
is hopeless: its derivative is a step, whose own derivative is zero almost everywhere, so the loss
is flat in ``x̂``. Haim et al. keep ReLU's forward pass and replace its derivative by
``sigmoid(α·z)``. We do this without touching the user's module: inside :class:`soft_activations`,
every call of ``torch.relu`` / ``F.relu`` / ``nn.ReLU`` (in-place or not) and
``F.leaky_relu`` / ``nn.LeakyReLU`` returns

    relu(z).detach() + (s(z) − s(z).detach()),   s(z) = softplus(α·z) / α,

whose value is exactly ``relu(z)`` and whose derivative is ``sigmoid(α·z)`` (leaky: scaled into
``[slope, 1]``), with a smooth second derivative. It works under ``torch.func`` transforms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_RELUS = {torch.relu, torch.relu_, F.relu, F.relu_, torch.Tensor.relu, torch.Tensor.relu_}
_LEAKY = {F.leaky_relu, F.leaky_relu_, torch._C._nn.leaky_relu, torch._C._nn.leaky_relu_}


def soft_relu(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """``relu(z)`` in value, ``sigmoid(α·z)`` in derivative."""
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
