"""The loss terms of TLDR's inversion and reconstruction (the TLDR paper, §3.3–3.4; docs/METHODS.md §3).

All images here are in display space ``(B, C, H, W)`` (pixel range [0, 1]); the classifier is
fed ``image − mean``. Each term is a plain function so that it can be checked on hand-made
inputs.

=================  ==========================================================================
``kl_term``        ``mean_b Σ_k P_bk log(P_bk / Q_bk)``, P the conditioning, Q = softmax(logits)
``ce_term``        ``mean_b −log Q_b,y_b``
``cosine_term``    ``1/(B(B−1)) Σ_{i≠j} cos(f_i, f_j)`` over a batch's features
``ortho_term``     ``1/B² Σ_ij (G_ij − δ_ij)²``, ``G = F Fᵀ`` (rows of F L2-normalised unless
                   ``normalize=False``: then raw features, as the formula is written)
``tv_term``        ``1/B Σ_b Σ_{c,h,w} (I_{h+1,w} − I_{h,w})² + (I_{h,w+1} − I_{h,w})²``
                   (in :mod:`exhume.attacks.engine.priors`, shared by every attack; re-exported here)
``pixel_term``     ``1/B Σ_b Σ relu(−I) + relu(I − 1)`` (the paper's sum, averaged over images;
                   likewise in :mod:`exhume.attacks.engine.priors`)
``grad_norm_term`` ``‖∇_θ mean_b L(f_θ(I_b), y_b)‖`` (``mode="batch"``) or
                   ``mean_b ‖∇_θ L(f_θ(I_b), y_b)‖`` (``mode="per-sample"``, torch.func vmap(grad))
=================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from exhume.attacks.engine.priors import pixel_term, tv_term  # noqa: F401  (re-exported: the tldr terms in one table)
from exhume.errors import ConfigError

GRAD_MODES = ("batch", "per-sample")
PERTURBATIONS = ("fgsm", "random")


def kl_term(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    logq = torch.log_softmax(logits, 1)
    return (torch.xlogy(target, target) - target * logq).sum(1).mean()


def ce_term(labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels.long())


def cosine_term(features: torch.Tensor) -> torch.Tensor:
    b = features.shape[0]
    if b < 2:
        return features.new_zeros(())
    f = F.normalize(features.flatten(1), dim=1)
    s = f @ f.T
    return (s.sum() - s.diagonal().sum()) / (b * (b - 1))


def ortho_term(features: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    f = features.flatten(1)
    if normalize:
        f = F.normalize(f, dim=1)
    b = f.shape[0]
    g = f @ f.T
    return ((g - torch.eye(b, dtype=g.dtype, device=g.device)) ** 2).sum() / b ** 2


def grad_norm_term(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                   inputs: torch.Tensor, labels: torch.Tensor, mode: str = "batch") -> torch.Tensor:
    """The norm of the classifier's parameter gradient of the cross-entropy at ``inputs``
    (classifier inputs, i.e. centred), differentiable with respect to ``inputs``.

    ``params`` must be tensors that require grad (detached copies of the classifier's weights).
    """
    if mode not in GRAD_MODES:
        raise ConfigError(f"unknown grad_mode {mode!r}; known: {', '.join(GRAD_MODES)}")
    if mode == "batch":
        out = functional_call(model, (params, buffers), (inputs,))
        loss = F.cross_entropy(out, labels.long())
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        return torch.sqrt(sum((g ** 2).sum() for g in grads) + 1e-12)

    def one(p, x, y):
        out = functional_call(model, (p, buffers), (x[None],))
        return F.cross_entropy(out, y[None])

    g = vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, labels.long())
    sq = sum((v.flatten(1) ** 2).sum(1) for v in g.values())
    return torch.sqrt(sq + 1e-12).mean()


def perturb(images: torch.Tensor, labels: torch.Tensor, classify: Callable[[torch.Tensor], torch.Tensor], eps: float,
            kind: str = "fgsm", generator: torch.Generator | None = None) -> torch.Tensor:
    """An L∞-perturbed copy ``I + δ``, ``‖δ‖∞ = eps``; ``δ`` is a constant (gradients flow to ``I``).

    ``fgsm``: ``δ = eps·sign(∇_I CE(classify(I), y))`` (the worst first-order direction);
    ``random``: ``δ = eps·(random signs)``.
    """
    if kind not in PERTURBATIONS:
        raise ConfigError(f"unknown perturbation {kind!r}; known: {', '.join(PERTURBATIONS)}")
    if kind == "random":
        signs = torch.randint(0, 2, images.shape, generator=generator).to(images) * 2 - 1
        return images + eps * signs
    probe = images.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(classify(probe), labels.long())
        (g,) = torch.autograd.grad(loss, probe)
    return images + eps * g.sign()
