"""What the evaluator measures of the informed adversary (docs/METHODS.md §7, "reconstructs a target").

A target is reconstructed when its best named candidate beats its best image of an unseen pool (§4's memorisation
criterion for the one unknown record); the game is won at k when the trained-on candidate's score is strictly above
every other of the first k (a tie loses). Rates carry their exact (Clopper–Pearson) interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exhume.evaluation.matching import match
from exhume.privacy import clopper_pearson


def reconstructed(records: torch.Tensor, candidates: torch.Tensor, pool: torch.Tensor) -> np.ndarray:
    """For each record ``(r, C, H, W)`` (display space): whether its best candidate beats its best pool image."""
    cands = candidates.float().clamp(0, 1)
    by_candidate = match(records.float(), cands, "ssim", one_to_one_too=False)["ssim"]
    by_pool = match(records.float(), pool.float(), "ssim", one_to_one_too=False)["ssim"]
    return np.asarray(by_candidate) > np.asarray(by_pool)


def game_wins(member: float, others: np.ndarray, ks: tuple[int, ...]) -> dict[int, bool]:
    """Whether the member's score beats the first ``k − 1`` other candidates' at each ``k`` (ties lose)."""
    others = np.asarray(others, dtype=np.float64)
    if any(k < 2 or k - 1 > len(others) for k in ks):
        raise ValueError(f"each game needs 2 ≤ k ≤ {len(others) + 1} candidates, got {ks}")
    return {k: bool(member > others[:k - 1].max()) for k in ks}


def rate(successes: int, trials: int) -> dict[str, Any]:
    """A measured rate with its 95 % Clopper–Pearson interval."""
    low, high = clopper_pearson(int(successes), int(trials))
    return {"successes": int(successes), "trials": int(trials), "rate": successes / trials, "low": low, "high": high}
