"""Training losses and margins, shared by victim training and the stationarity attacks.

Every loss is a function of the network output ``out`` and the target ``y`` *per sample*; the
training objective is ``mean_i loss(out_i, y_i) + (weight_decay / 2) · ‖θ‖²``.

``loss_derivative`` is ``∂ loss / ∂ out``; at a stationary point of the objective

    θ = −1/(n · weight_decay) · Σ_i ∂loss_i/∂out_i · ∇_θ out_i,

which is the equation the weight-decay form of the KKT attack solves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from exhume.errors import ConfigError

LOSSES = ("logistic", "cross-entropy", "squared")
#: the losses of a classifier (a margin, and multipliers tied to it)
CLASSIFIER_LOSSES = LOSSES[:2]
#: other names users give them (the audit takes these too): BCE-with-logits is the logistic loss
LOSS_ALIASES = {"bce": "logistic", "bce-with-logits": "logistic", "binary-cross-entropy": "logistic", "ce": "cross-entropy"}


def check_loss(name: str) -> str:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")
    return name


def per_sample_loss(name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if name == "logistic":  # y in {-1, +1}, out (n,)
        return F.softplus(-y * out)
    if name == "cross-entropy":  # y class ids, out (n, K)
        return F.cross_entropy(out, y.long(), reduction="none")
    if name == "squared":
        diff = out - y
        return 0.5 * (diff.reshape(diff.shape[0], -1) ** 2).sum(1)
    raise ConfigError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")


def margin(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y · Φ(x)`` for binary outputs, ``Φ_y − max_{k≠y} Φ_k`` for multiclass outputs."""
    if out.dim() == 1:
        return y.to(out.dtype) * out
    true, others = _true_and_others(out, y)
    return true - others.amax(1)


def _true_and_others(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The true class's logit and the logits with the true class masked to −inf (multiclass outputs)."""
    yl = y.long()
    # a comparison, not F.one_hot, which checks the labels' range with .item() and so fails under torch.func.vmap
    true_class = yl[:, None] == torch.arange(out.shape[1], device=out.device)
    return out.gather(1, yl[:, None]).squeeze(1), out.masked_fill(true_class, float("-inf"))


def soft_margin(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``Φ_y − log Σ_{k≠y} exp Φ_k`` for multiclass outputs (the margin itself for binary outputs).

    Its parameter gradient is ``Σ_{k≠y} q_k ∇(Φ_y − Φ_k)`` with ``q`` the softmax of the other
    classes' logits: the direction of a cross-entropy gradient, which spreads over every other class
    by its probability (``−∇ℓ_CE = (1 − p_y)·∇soft_margin`` exactly, and ``1 − p_y = σ(−soft_margin)``),
    where :func:`margin` takes the runner-up alone. Never larger than :func:`margin`.
    """
    if out.dim() == 1:
        return margin(out, y)
    true, others = _true_and_others(out, y)
    return true - torch.logsumexp(others, dim=1)


def weighs_by_soft_margin(task: str, loss: str | None) -> bool:
    """Whether each training point weighs ``σ(−soft_margin)`` in the loss's gradient: a multiclass model
    trained with cross-entropy (or of unknown loss, taken as cross-entropy); else the margin serves."""
    return task == "multiclass" and loss in (None, "cross-entropy")


def relative_objective_gradient(model, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> float:
    """‖∇_θ objective‖ / ‖weight_decay · θ‖ of ``mean ℓ + (w/2)‖θ‖²`` on ``(x, y)``: 0 at a stationary point of it."""
    params = [p for p in model.parameters() if p.requires_grad]
    obj = per_sample_loss(loss, model(x), y).mean()
    grads = torch.autograd.grad(obj, params)
    num = sum(((g + weight_decay * p) ** 2).sum() for g, p in zip(grads, params)).sqrt()
    den = sum(((weight_decay * p) ** 2).sum() for p in params).sqrt().clamp_min(1e-30)
    return float((num / den).detach())
