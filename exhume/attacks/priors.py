"""The image priors every attack draws on, in one place.

All images are in display space ``(B, C, H, W)`` unless said otherwise.

=================  ==========================================================================
``tv_term``        ``1/B Σ_b Σ_{c,h,w} (I_{h+1,w} − I_{h,w})² + (I_{h,w+1} − I_{h,w})²``
                   (squared total variation, mean over images: kkt's ``tv_weight``, tldr's η₁)
``pixel_term``     ``1/B Σ_b Σ relu(−I) + relu(I − 1)`` (TLDR's pixel-range sum, mean over images)
``range_penalty``  ``Σ relu(v − hi)² + relu(lo − v)²`` (kkt's squared pixel-range prior, any shape)
``project_range``  ``v ← min(max(v, lo), hi)`` in place (bilevel's projection onto the range)
=================  ==========================================================================
"""

from __future__ import annotations

import torch


def tv_term(images: torch.Tensor) -> torch.Tensor:
    dh = images[:, :, 1:, :] - images[:, :, :-1, :]
    dw = images[:, :, :, 1:] - images[:, :, :, :-1]
    return ((dh ** 2).sum() + (dw ** 2).sum()) / images.shape[0]


def pixel_term(images: torch.Tensor) -> torch.Tensor:
    return (torch.relu(-images) + torch.relu(images - 1)).sum() / images.shape[0]


def range_penalty(v: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return (torch.relu(v - hi) ** 2 + torch.relu(lo - v) ** 2).sum()


def project_range(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float) -> None:
    """Clamp the leaf tensor ``x`` into ``[lo, hi]`` in place (bounds may be tensors, e.g. ``−mean``)."""
    lo, hi = torch.as_tensor(lo, dtype=x.dtype, device=x.device), torch.as_tensor(hi, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        x.copy_(torch.minimum(torch.maximum(x, lo), hi))
