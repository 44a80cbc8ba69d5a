"""Is a class-conditioned reconstruction *training-like*? (TLDR; docs/METHODS.md §3–4)

For class-labelled candidates (e.g. a generator's samples), :func:`per_class_evaluation` compares
them, class by class, with the training images of that class and with a held-out set of unseen
images of the same size and classes:

- per class, the usual judgement (:func:`~exhume.evaluation.evaluate_images`: nearest and
  one-to-one Hungarian matching by SSIM, counts at SSIM ≥ 0.4) against the training images and,
  separately, against the held-out images;
- per candidate, the distance to its nearest training image and to its nearest held-out image of
  the same class (L2 in pixel space and 1 − SSIM), and whether the training image is the nearer.

A reconstruction is training-like in a measured sense when candidates are nearer to training
images than to held-out ones (``frac_nearer_train_ssim`` above 0.5, ``ssim_to_train_mean`` above
``ssim_to_heldout_mean``); a merely plausible sample of the class is as near to either set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError
from .matching import l2_matrix
from .metrics import evaluate_images
from .plots import save_figure, subplots
from .ssim import as_images, ssim_matrix


def per_class_evaluation(candidates, cand_labels, train_x, train_y, held_x, held_y) -> dict[str, Any]:
    """Judge labelled ``candidates`` against the training set and a held-out set, per class.

    All images ``(n, C, H, W)`` in [0, 1] (candidates are clipped); labels are class ids.
    Classes without candidates, training or held-out images are skipped (and listed).
    """
    cands = as_images(torch.as_tensor(candidates).float().clamp(0, 1), "candidates")
    train_x, held_x = as_images(train_x, "training images"), as_images(held_x, "held-out images")
    cl, ty, hy = (torch.as_tensor(v).long().reshape(-1) for v in (cand_labels, train_y, held_y))
    if len(cl) != len(cands) or len(ty) != len(train_x) or len(hy) != len(held_x):
        raise DataError("per_class_evaluation: each image set needs one label per image")
    classes = sorted(set(cl.tolist()))
    rows, skipped = [], []
    near = {"l2_train": [], "l2_held": [], "ssim_train": [], "ssim_held": []}
    totals = {"train_ssim>=0.4": 0, "train_one_to_one_ssim>=0.4": 0, "held_ssim>=0.4": 0, "held_one_to_one_ssim>=0.4": 0,
              "n_train": 0, "n_held": 0}
    for c in classes:
        cc, tc, hc = cands[cl == c], train_x[ty == c], held_x[hy == c]
        if len(tc) == 0 or len(hc) == 0:
            skipped.append(c)
            continue
        et = evaluate_images(cc, tc).metrics
        eh = evaluate_images(cc, hc).metrics
        s_t, s_h = ssim_matrix(cc, tc).numpy(), ssim_matrix(cc, hc).numpy()
        d_t, d_h = l2_matrix(cc, tc).numpy(), l2_matrix(cc, hc).numpy()
        near["ssim_train"].append(s_t.max(1))
        near["ssim_held"].append(s_h.max(1))
        near["l2_train"].append(d_t.min(1))
        near["l2_held"].append(d_h.min(1))
        row = {"class": c, "candidates": len(cc), "n_train": len(tc), "n_held": len(hc),
               "train_ssim>=0.4": et["ssim>=0.4"], "train_one_to_one_ssim>=0.4": et["one_to_one_ssim>=0.4"],
               "train_ssim_mean": et["ssim_mean"],
               "held_ssim>=0.4": eh["ssim>=0.4"], "held_one_to_one_ssim>=0.4": eh["one_to_one_ssim>=0.4"],
               "held_ssim_mean": eh["ssim_mean"],
               "cand_ssim_to_train": float(s_t.max(1).mean()), "cand_ssim_to_held": float(s_h.max(1).mean()),
               "cand_l2_to_train": float(d_t.min(1).mean()), "cand_l2_to_held": float(d_h.min(1).mean())}
        rows.append(row)
        for k in ("train_ssim>=0.4", "train_one_to_one_ssim>=0.4", "held_ssim>=0.4", "held_one_to_one_ssim>=0.4"):
            totals[k] += row[k]
        totals["n_train"] += len(tc)
        totals["n_held"] += len(hc)
    if not rows:
        raise DataError("no class has candidates, training images and held-out images")
    arr = {k: np.concatenate(v) for k, v in near.items()}
    return {
        "per_class": rows,
        "skipped_classes": skipped,
        **totals,
        "ssim_to_train_mean": float(arr["ssim_train"].mean()),
        "ssim_to_heldout_mean": float(arr["ssim_held"].mean()),
        "l2_to_train_mean": float(arr["l2_train"].mean()),
        "l2_to_heldout_mean": float(arr["l2_held"].mean()),
        "frac_nearer_train_ssim": float((arr["ssim_train"] > arr["ssim_held"]).mean()),
        "frac_nearer_train_l2": float((arr["l2_train"] < arr["l2_held"]).mean()),
        "note": ("per candidate: its nearest image of the same class in the training set vs in a held-out set of "
                 "the same size (SSIM: higher is nearer; L2 in [0,1] pixel units: lower is nearer); counts are "
                 "training (resp. held-out) images whose nearest / Hungarian-matched candidate has SSIM >= 0.4"),
    }


def class_grid(candidates, labels, path: str | Path, per_class: int = 10, title: str | None = None,
               scores=None) -> Path:
    """One row per class, up to ``per_class`` samples each (clipped to [0, 1])."""
    x = torch.as_tensor(candidates).float().clamp(0, 1).numpy()
    lab = torch.as_tensor(labels).long().numpy()
    classes = sorted(set(lab.tolist()))
    if not classes:
        raise DataError("class_grid: no candidates to draw")
    fig, axes = subplots(len(classes), per_class, figsize=(per_class * 0.75, len(classes) * 0.8), squeeze=False)
    for r, c in enumerate(classes):
        idx = np.flatnonzero(lab == c)[:per_class]
        for j in range(per_class):
            ax = axes[r, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j < len(idx):
                img = x[idx[j]]
                if img.shape[0] == 1:
                    ax.imshow(img[0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
                else:
                    ax.imshow(np.transpose(img, (1, 2, 0)), interpolation="nearest")
                if scores is not None:
                    ax.set_title(f"{float(scores[idx[j]]):.2f}", fontsize=5)
            else:
                ax.axis("off")
        axes[r, 0].set_ylabel(str(c), rotation=0, labelpad=8)
    if title:
        fig.suptitle(title, fontsize=8)
    return save_figure(fig, path)
