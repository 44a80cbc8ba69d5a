"""Membership uncertainty: can the reconstructions tell training images from unseen ones?

Runkel et al.'s point: a reconstruction that looks like a real image need not be a training image,
and an attacker who sees only the candidates cannot tell. This module measures it.

Definitions (display space, images flattened, Euclidean distance):

- per candidate ``c``: ``d_train(c)`` = distance to the nearest training image and
  ``d_heldout(c)`` = distance to the nearest held-out image (same distribution, disjoint from the
  training set). ``candidate_closer_to_train`` = the fraction of candidates with
  ``d_train < d_heldout``. It needs the training set, so only the evaluator can compute it; for
  candidates unrelated to either set it is about ``n_train / (n_train + n_heldout)`` (reported as
  ``candidate_closer_to_train_chance``; 0.5 for equal sizes).
- **membership AUC** (``auc``): the attacker holds the candidates and is shown a record ``z`` (a
  training image or a held-out image) and must say whether ``z`` was a member. Using the candidates
  alone, the natural test scores ``z`` by how close the nearest candidate comes,
  ``s(z) = −min_j ‖z − c_j‖``. ``auc`` is the ROC AUC of ``s`` for members (training images,
  positives) against non-members (held-out images, negatives), ties counted half (Mann–Whitney).
  1.0: the reconstructions single out the training images; 0.5: they carry no membership
  information (images that look real, but of nobody in particular); below 0.5: they resemble
  non-members more (e.g. reconstructions that followed a partition initialisation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata

from exhume.errors import ConfigError


def _flat(x, what: str) -> torch.Tensor:
    x = torch.as_tensor(x).detach().float()
    if x.dim() < 2 or x.shape[0] == 0:
        raise ConfigError(f"{what} must be a non-empty batch of images (N, ...), got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ConfigError(f"{what} contains NaN or inf")
    return x.reshape(x.shape[0], -1)


def auc_mann_whitney(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC = P(score(pos) > score(neg)) + ½ P(tie)."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def membership_uncertainty(candidates, train, heldout) -> dict[str, Any]:
    """Membership AUC and per-candidate distances (see the module docstring for the definitions)."""
    c, t, h = _flat(candidates, "candidates"), _flat(train, "train"), _flat(heldout, "heldout")
    if not (c.shape[1] == t.shape[1] == h.shape[1]):
        raise ConfigError(f"candidates, train and heldout must have the same image size; got {c.shape[1]}, {t.shape[1]}, {h.shape[1]}")
    from exhume.evaluation.matching import min_distances  # in blocks: (m, n) and (m, k) are never held whole

    d_train, near_t = (v.numpy() for v in min_distances(c, t))
    d_heldout, near_h = (v.numpy() for v in min_distances(c, h))
    score_members = -near_t  # for each training image: −distance to the nearest candidate
    score_non = -near_h
    return {
        "auc": auc_mann_whitney(score_members, score_non),
        "candidate_closer_to_train": float(np.mean(d_train < d_heldout)),
        "candidate_closer_to_train_chance": t.shape[0] / (t.shape[0] + h.shape[0]),
        "mean_d_train": float(d_train.mean()),
        "mean_d_heldout": float(d_heldout.mean()),
        "d_train": d_train,
        "d_heldout": d_heldout,
        "n_train": int(t.shape[0]),
        "n_heldout": int(h.shape[0]),
        "definition": "ROC AUC of s(z) = -min_j ||z - c_j||_2 (display space) for training images vs held-out images; "
                      "0.5 = no membership information in the candidates",
    }
