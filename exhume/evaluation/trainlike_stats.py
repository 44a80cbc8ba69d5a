"""Statistical tests for "training-like" (TLDR, docs/METHODS.md §3): a share above 0.5 is not evidence.

1. :func:`nearer_train_test`: per candidate, is its nearest training image (same class) nearer
   than its nearest held-out image? Under the null — the candidates carry no information about
   which images were trained on — and with training and held-out sets exchangeable (same size per
   class, same distribution), each candidate is nearer the training side with probability 1/2.
   One-sided **binomial** (sign) test on the count (ties dropped) and a one-sided **sign-flip
   permutation** test on the mean paired difference ``d_held − d_train``. Both treat candidates as
   independent; samples of one generator are not quite, so read small p as "worth a look", not
   proof. :func:`per_class_nearest` equalises the two sets per class (seeded subsample) so that
   the null holds by construction.
2. :func:`victim_signals` / :func:`signal_separation`: do the signals TLDR optimises — confidence
   ``p(y|x)``, per-sample parameter-gradient norm ``‖∇_θ CE‖`` and robustness (confidence after an
   FGSM step of size ``eps``) — separate the victim's *real* training images from held-out ones?
   AUC (training = positive, oriented so that the paper's expectation gives AUC > 0.5) and the
   one-sided Mann–Whitney p-value. If they do not, optimising them cannot pull samples toward
   the training set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import binomtest, mannwhitneyu
from torch import nn
from torch.func import functional_call, grad, vmap

from ..errors import DataError
from .matching import l2_matrix
from .ssim import ssim_matrix


def nearer_train_test(d_train, d_held, higher_is_nearer: bool = False, permutations: int = 10000,
                      seed: int = 0) -> dict[str, Any]:
    """Paired one-sided tests that candidates are nearer the training set than the held-out set.

    ``d_train[i]``, ``d_held[i]``: candidate ``i``'s distance (or, with ``higher_is_nearer``, its
    similarity, e.g. SSIM) to its nearest training / held-out image.
    """
    a, b = np.asarray(d_train, dtype=float).reshape(-1), np.asarray(d_held, dtype=float).reshape(-1)
    if a.shape != b.shape or a.size == 0:
        raise DataError(f"nearer_train_test needs two equal-length non-empty arrays, got {a.shape} and {b.shape}")
    diff = (a - b) if higher_is_nearer else (b - a)  # > 0: the training image is the nearer
    untied = diff[diff != 0]
    k, n = int((untied > 0).sum()), int(untied.size)
    p_binom = float(binomtest(k, n, 0.5, alternative="greater").pvalue) if n else 1.0
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(permutations, diff.size))
    null = (signs * np.abs(diff)).mean(1)
    p_perm = float((1 + (null >= diff.mean() - 1e-15).sum()) / (permutations + 1))
    return {"candidates": int(diff.size), "ties": int(diff.size - n), "nearer_train": k,
            "share_nearer_train": k / n if n else float("nan"), "binomial_p": p_binom,
            "mean_difference": float(diff.mean()), "permutation_p": p_perm, "permutations": permutations}


def per_class_nearest(cands: torch.Tensor, labels, train_x: torch.Tensor, train_y, held_x: torch.Tensor, held_y,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Per candidate, the SSIM to / L2 distance from its nearest training and held-out image of its
    class, after subsampling both sets to the same size per class (so that they are exchangeable)."""
    cl, ty, hy = (torch.as_tensor(v).long().reshape(-1) for v in (labels, train_y, held_y))
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {"ssim_train": [], "ssim_held": [], "l2_train": [], "l2_held": []}
    for c in sorted(set(cl.tolist())):
        ti, hi = np.flatnonzero(ty.numpy() == c), np.flatnonzero(hy.numpy() == c)
        m = min(len(ti), len(hi))
        if m == 0:
            continue
        ti, hi = rng.choice(ti, m, replace=False), rng.choice(hi, m, replace=False)
        cc = cands[cl == c].float().clamp(0, 1)
        tc, hc = train_x[torch.as_tensor(ti)].float(), held_x[torch.as_tensor(hi)].float()
        out["ssim_train"].append(ssim_matrix(cc, tc).max(1).values.numpy())
        out["ssim_held"].append(ssim_matrix(cc, hc).max(1).values.numpy())
        out["l2_train"].append(l2_matrix(cc, tc).min(1).values.numpy())
        out["l2_held"].append(l2_matrix(cc, hc).min(1).values.numpy())
    if not out["l2_train"]:
        raise DataError("per_class_nearest: no class has candidates, training and held-out images")
    return {k: np.concatenate(v) for k, v in out.items()}


def membership_tests(cands, labels, train_x, train_y, held_x, held_y, seed: int = 0) -> dict[str, Any]:
    """:func:`nearer_train_test` by SSIM and by L2 on :func:`per_class_nearest`."""
    near = per_class_nearest(torch.as_tensor(cands), labels, torch.as_tensor(train_x), train_y,
                             torch.as_tensor(held_x), held_y, seed)
    return {"ssim": nearer_train_test(near["ssim_train"], near["ssim_held"], higher_is_nearer=True, seed=seed),
            "l2": nearer_train_test(near["l2_train"], near["l2_held"], seed=seed),
            "note": "one-sided; null: each candidate is as likely nearer a held-out as a training image "
                    "(sets equalised per class by a seeded subsample)"}


def victim_signals(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float = 0.05,
                   batch: int = 256) -> dict[str, np.ndarray]:
    """Per image (classifier inputs ``x``, class ids ``y``): confidence ``p(y|x)``, ``‖∇_θ CE‖`` and
    the confidence after an FGSM step ``x + eps·sign(∇_x CE)``. ``model`` is used in eval mode."""
    model = model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one(p, xi, yi):
        return F.cross_entropy(functional_call(model, (p, buffers), (xi[None],)), yi[None])

    conf, gnorm, robust = [], [], []
    for s in range(0, len(x), batch):
        xb, yb = x[s:s + batch].float(), torch.as_tensor(y[s:s + batch]).long()
        g = vmap(grad(one), in_dims=(None, 0, 0))(params, xb, yb)
        gnorm.append(torch.sqrt(sum((v.flatten(1) ** 2).sum(1) for v in g.values())).detach())
        probe = xb.clone().requires_grad_(True)
        logits = model(probe)
        (gx,) = torch.autograd.grad(F.cross_entropy(logits, yb), probe)
        with torch.no_grad():
            conf.append(torch.softmax(logits, 1).gather(1, yb[:, None])[:, 0])
            robust.append(torch.softmax(model(xb + eps * gx.sign()), 1).gather(1, yb[:, None])[:, 0])
    return {"confidence": torch.cat(conf).numpy(), "grad_norm": torch.cat(gnorm).numpy(),
            "fgsm_confidence": torch.cat(robust).numpy()}


#: the paper's expectation for training images: higher confidence, smaller gradient, more robust
EXPECTED_HIGHER_ON_TRAIN = {"confidence": True, "grad_norm": False, "fgsm_confidence": True}


def signal_separation(train: dict[str, np.ndarray], held: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per signal: AUC of training against held-out images (oriented so that the paper's expectation
    gives AUC > 0.5) and the one-sided Mann–Whitney p-value, with the medians."""
    out: dict[str, Any] = {}
    for name, higher in EXPECTED_HIGHER_ON_TRAIN.items():
        a, b = np.asarray(train[name], float), np.asarray(held[name], float)
        if not higher:
            a, b = -a, -b
        u, p = mannwhitneyu(a, b, alternative="greater")
        out[name] = {"auc": float(u / (len(a) * len(b))), "mannwhitney_p": float(p),
                     "median_train": float(np.median(train[name])), "median_heldout": float(np.median(held[name])),
                     "expected": "higher on training images" if higher else "lower on training images"}
    return out
