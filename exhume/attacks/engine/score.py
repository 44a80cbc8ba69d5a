"""An attacker-side score for a reconstruction: computed from the weights and the candidates only.

A real attacker cannot count how many training images a run recovered, so a hyperparameter search
must rank runs by what the attacker can see. The score here is the product of two shares, both
in [0, 1] (higher is better)::

    score = explained × plausible

**explained** ``= 1 − min(r, 1)`` with ``r = ‖θ − Σ_j λ_j ∇_θ margin(x̂_j)‖² / ‖θ‖²``, the relative
stationarity residual with the *exact* ReLU derivative (not the attack's surrogate): the share of
the weights that the candidates and their multipliers explain as a KKT point.

**plausible** is the mean over candidates of a per-candidate plausibility in [0, 1], the product of

* *distinct*: 0 when an earlier candidate has cosine similarity ≥ 0.95 with it (centred space), so
  collapsed duplicates count once;
* *non-degenerate*: 0 when no pixel differs from the data mean by 0.25 or more (the largest
  ``|x̂ − mean|`` in display units) — a candidate shrunk to the data mean is no image;
* *in range*: the share of its pixels within [−0.05, 1.05] (the pixel prior);
* *margin-consistent*: a training point's multiplier fixes its margin. With weight decay ``w`` and
  the logistic loss, ``λ_i = σ(−margin_i)/(n·w)`` (Buzaglo et al.), so ``λ_j`` implies a margin
  ``m_j = log(1/(λ_j·n·w) − 1)``; without weight decay (Haim et al.) a point with an active
  multiplier sits on the margin, ``m_j = 1``. The term is ``exp(−|log(margin_j / m_j)|)`` when the
  candidate's actual margin ``y_j Φ(x̂_j)`` is positive, else 0. A candidate whose multiplier
  implies no finite margin (``λ_j·n·w ≥ 1``) gets 0; an inactive multiplier (below 1e-3 of the
  median) gets 0.

The components are returned too (tune records them on each trial). Nothing here reads a training image:
the inputs are an :class:`~exhume.victim.AttackerView`, the candidates, their labels and multipliers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from exhume.attacks.engine.base import attack_model
from exhume.equations.stationarity import stationarity_residual
from exhume.errors import ConfigError
from exhume.files import LIMITS
from exhume.losses import margin as margin_fn

DUPLICATE_COSINE = 0.95
MIN_DEVIATION = 0.25
PIXEL_SLACK = 0.05


def check_scorable(view) -> None:
    """Refuse (ConfigError) a view the attacker-side score cannot judge: it must be an attacker's view (what an
    AttackerView holds, never a Victim with its training set) of a binary task."""
    if hasattr(view, "attacker_view") or not all(hasattr(view, a) for a in ("model", "task", "input_shape", "mean")):
        raise ConfigError(f"attacker_score needs an AttackerView (never the victim's training set), got {type(view).__name__}")
    if view.task != "binary":
        raise ConfigError(f"the attacker-side score (and so exhume tune) handles binary victims only; this victim's task is {view.task!r}")


def candidate_terms(view, candidates: torch.Tensor, labels: torch.Tensor, multipliers: torch.Tensor | None,
                    n_guess: int | None = None) -> dict[str, torch.Tensor]:
    """The per-candidate terms in [0, 1]: ``distinct``, ``non_degenerate``, ``in_range`` (any task)
    and, for a binary task with ``multipliers``, ``margin_consistent``. Float64 tensors of length m."""
    dtype = torch.float64
    mean = view.mean.to(dtype)
    x = candidates.to(dtype) - mean
    m = x.shape[0]
    flat = x.reshape(m, -1)
    disp = candidates.to(dtype).reshape(m, -1)
    # distinct: greedy, an earlier near-duplicate makes a later one count zero
    earlier = earlier_duplicates(flat, DUPLICATE_COSINE)
    terms = {"distinct": (~earlier).to(dtype),
             "non_degenerate": (flat.abs().max(dim=1).values >= MIN_DEVIATION).to(dtype),
             "in_range": ((disp >= -PIXEL_SLACK) & (disp <= 1 + PIXEL_SLACK)).to(dtype).mean(dim=1)}
    if view.task == "binary" and multipliers is not None:
        model, _ = attack_model(view.model, next(view.model.parameters()).device, dtype)
        with torch.no_grad():
            margins = margin_fn(model(x), labels.to(dtype)).reshape(-1)
        terms["margin_consistent"] = _margin_consistency(view, margins, multipliers.to(dtype), n_guess or view.n_train_hint or max(1, m // 2))
    return terms


def earlier_duplicates(flat: torch.Tensor, threshold: float = DUPLICATE_COSINE) -> torch.Tensor:
    """Whether each row of ``flat`` (m, d) has an earlier row whose cosine similarity with it is ``>= threshold``.

    Computed over blocks of rows against the rows before the block's end (at most
    ``LIMITS.candidates_x_pool_block`` cosines at once), never as the m × m matrix: a portfolio
    restart of 120,000 candidates (m = 2n for n = 60,000) would need 115 GB for it in float64.
    """
    m = flat.shape[0]
    norms = flat.norm(dim=1).clamp_min(1e-12)
    earlier = torch.zeros(m, dtype=torch.bool, device=flat.device)
    rows = max(1, min(m, LIMITS.candidates_x_pool_block // max(m, 1)))
    for s in range(0, m, rows):
        e = min(m, s + rows)
        cos = (flat[s:e] @ flat[:e].T) / (norms[s:e, None] * norms[None, :e])
        earlier[s:e] = torch.tril(cos >= threshold, diagonal=s - 1).any(dim=1)  # columns j < i (global)
    return earlier


def _margin_consistency(view, margins: torch.Tensor, lam: torch.Tensor, n: int) -> torch.Tensor:
    wd = view.weight_decay or 0.0
    active = lam > 1e-3 * lam.abs().median().clamp_min(1e-30)
    if wd > 0 and view.loss in (None, "logistic"):
        s = lam * n * wd
        ok = active & (s > 0) & (s < 1)
        target = torch.where(ok, torch.log((1.0 / s.clamp(1e-300, 1 - 1e-12)) - 1.0), torch.ones_like(s))
        ok = ok & (target > 0)
    else:
        ok = active
        target = torch.ones_like(lam)
    pos = margins > 0
    ratio = torch.where(pos & ok, margins.clamp_min(1e-12) / target.clamp_min(1e-12), torch.ones_like(margins))
    return torch.where(pos & ok, torch.exp(-ratio.log().abs()), torch.zeros_like(margins))


def attacker_score(view, candidates: torch.Tensor, labels: torch.Tensor, multipliers: torch.Tensor,
                   n_guess: int | None = None) -> dict[str, Any]:
    """Score ``candidates`` (display space, shape ``(m, *input_shape)``) for ``view``.

    Returns ``{"score", "explained", "plausible", "relative_stationarity", "distinct",
    "non_degenerate", "in_range", "margin_consistent"}`` (shares are means over candidates).
    """
    check_scorable(view)
    dtype = torch.float64
    model, params = attack_model(view.model, next(view.model.parameters()).device, dtype)
    theta2 = sum((p ** 2).sum() for p in params.values())
    with torch.no_grad():
        r = float(stationarity_residual(model, params, candidates.to(dtype) - view.mean.to(dtype), labels.to(dtype),
                                        multipliers.to(dtype), None) / theta2)
    if not math.isfinite(r):
        r = float("inf")
    t = candidate_terms(view, candidates, labels, multipliers, n_guess)
    per = t["distinct"] * t["non_degenerate"] * t["in_range"] * t["margin_consistent"]
    explained = max(0.0, 1.0 - min(r, 1.0))
    plausible = float(per.mean())
    return {
        "score": explained * plausible,
        "explained": explained,
        "plausible": plausible,
        "relative_stationarity": r,
        **{k: float(v.mean()) for k, v in t.items()},
    }


def score_reconstruction(view, recon) -> dict[str, Any]:
    """:func:`attacker_score` of a saved :class:`~exhume.attacks.Reconstruction` (its ``scores`` are the λ)."""
    if recon.scores is None:
        raise ConfigError(f"the reconstruction from {recon.method!r} has no multipliers (scores); the attacker-side score needs them")
    return attacker_score(view, recon.candidates, recon.labels, recon.scores, recon.record.n_guess)
