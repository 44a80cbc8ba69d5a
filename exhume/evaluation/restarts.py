"""How many restarts of a portfolio found each memorised training image (evaluator-side).

A pooled :class:`~exhume.attacks.Reconstruction` records, per candidate, which restarts produced
it or one of the near-duplicates merged into it (``provenance["members"]``, candidates ×
restarts). Restart ``k`` **found** training image ``i`` when the best of restart ``k``'s
candidates for ``i`` (same matching rule as the pooled evaluation) beats the best image of the
pool of unseen images, exactly the memorisation test run on that restart's share of the pool.
The held-out control is not split: it is computed once, on all pooled candidates, so pooling
more restarts cannot buy matches on non-members without the control showing it.
"""

from __future__ import annotations

import numpy as np
import torch

from .matching import match


def restart_breakdown(candidates: torch.Tensor, train: torch.Tensor, pool_ssim: np.ndarray, members: torch.Tensor,
                      memorised: np.ndarray, rule: str = "ssim") -> tuple[dict, dict[str, np.ndarray]]:
    """``(metrics, arrays)``: per-restart memorised counts and the found-by histogram of the memorised images."""
    members = torch.as_tensor(members).bool()
    n, restarts = train.shape[0], members.shape[1]
    found = np.zeros((n, restarts), dtype=bool)
    for k in range(restarts):
        idx = torch.nonzero(members[:, k]).flatten()
        if idx.numel() == 0:
            continue
        found[:, k] = match(train, candidates[idx], rule, False)["ssim"] > pool_ssim
    found_by = found.sum(axis=1)
    hist = {str(c): int(np.sum(found_by[memorised] == c)) for c in range(1, restarts + 1) if np.any(found_by[memorised] == c)}
    metrics = {
        "memorised_per_restart": [int(x) for x in found.sum(axis=0)],
        "memorised_found_by": hist,
        "memorised_found_by_note": ("memorised training images (pooled) by the number of restarts whose own candidates beat the "
                                    "best unseen image for them; the control is computed on the pooled candidates only"),
    }
    return metrics, {"found_by_restarts": found_by, "found_by_restart": found}
