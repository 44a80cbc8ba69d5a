"""The image priors every attack draws on, in one place.

All images are in display space ``(B, C, H, W)`` unless said otherwise.

=================  ==========================================================================
``tv_term``        ``1/B Σ_b Σ_{c,h,w} (I_{h+1,w} − I_{h,w})² + (I_{h,w+1} − I_{h,w})²``
                   (squared total variation, mean over images: kkt's ``tv_weight``, tldr's η₁)
``pixel_term``     ``1/B Σ_b Σ relu(−I) + relu(I − 1)`` (TLDR's pixel-range sum, mean over images)
``range_penalty``  ``Σ relu(v − hi)² + relu(lo − v)²`` (kkt's squared pixel-range prior, any shape)
``project_range``  ``v ← min(max(v, lo), hi)`` in place (bilevel's projection onto the range)
``dark_floor``     ``v ← max(v − τ, 0) / (1 − τ)`` (kkt's ``background``: soft-thresholds the
                   haze off a dark background; ``background_level`` picks ``τ`` from the data mean)
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


#: kkt's ``background="auto"``: the soft threshold ``τ`` (in units of the [0, 1] pixel range) on dark-background data
BACKGROUND_TAU = 0.03
#: data count as dark-background when at least this share of the mean image's pixels ...
DARK_SHARE = 0.05
#: ... is at most this bright (MNIST: 42 % of its mean's pixels, Fashion-MNIST 8 %, 8×8 digits 23 %; a mid-grey mean such as CIFAR-10's: none)
DARK_LEVEL = 0.01


def dark_floor(v: torch.Tensor, tau: float) -> torch.Tensor:
    """Soft-threshold display-space candidates at ``tau`` and stretch back to the range: ``max(v − τ, 0) / (1 − τ)``.

    The proximal step of an L1 penalty on pixel intensity (Donoho's soft threshold): the faint haze a
    stationarity attack leaves around the object goes to exactly 0, the background such data has;
    strokes keep their shape and full brightness (values above 1 stay above, as before). ``tau = 0``
    returns ``v`` unchanged.
    """
    if tau <= 0:
        return v
    return torch.clamp(v - tau, min=0.0) / (1.0 - tau)


def background_level(setting, mean: torch.Tensor, input_shape: tuple[int, ...]) -> tuple[float, str]:
    """``τ`` for :func:`dark_floor` and why: a number is used as given; ``"auto"`` gives
    ``BACKGROUND_TAU`` on image data whose mean image shows a dark background (at least ``DARK_SHARE``
    of its pixels at most ``DARK_LEVEL``), else 0. Attacker-side: the data mean is part of the view."""
    if setting != "auto":
        return float(setting), "given"
    if len(input_shape) != 3:
        return 0.0, "not image inputs"
    m = mean.detach().float().reshape(-1)
    if m.numel() == 1 or torch.unique(m).numel() <= input_shape[0]:
        return 0.0, "the data mean is one number per channel: no per-pixel background to read"
    share = float((m <= DARK_LEVEL).float().mean())
    if share < DARK_SHARE:
        return 0.0, f"{share:.0%} of the mean image's pixels are dark (<= {DARK_LEVEL}); not a dark background"
    return BACKGROUND_TAU, f"{share:.0%} of the mean image's pixels are dark (<= {DARK_LEVEL})"
