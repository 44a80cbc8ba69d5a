"""Which iterate an attack returns: an average of late iterates and the snapshot its own criterion prefers.

The last iterate of a long optimisation carries the pixel noise of its last steps and, on some
victims, drifts away from the training images after a plateau. :class:`IterateTracker` keeps

- an exponential moving average of the iterates (``decay`` β; the first ``1/(1−β)`` iterations are
  averaged uniformly, β_t = min(β, 1 − 1/t), so the start carries no bias towards zero). The
  averaged pixel noise of uncorrelated steps shrinks like ``sqrt((1−β)/(1+β))``;
- the *snapshot*: every ``every`` iterations the attacker-side criterion (the attack's own loss,
  computed from the weights alone) is evaluated on the averaged iterate, and the lowest one is kept
  with its iteration number, so a longer run never returns an iterate its own criterion ranks worse.

``decay=0`` tracks the last iterate itself (no averaging).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class IterateTracker:
    """The averaged iterate, the kept snapshot and their counters, all as tensors (saved in checkpoints)."""

    def __init__(self, tensors: dict[str, torch.Tensor], decay: float, every: int) -> None:
        self.decay, self.every = float(decay), int(every)
        self.avg = {k: v.detach().clone() for k, v in tensors.items()}
        self.best = {k: v.detach().clone() for k, v in tensors.items()}
        # iterates averaged so far, the kept snapshot's criterion and iteration
        self.meta = torch.tensor([0.0, float("inf"), 0.0], dtype=torch.float64)

    @property
    def count(self) -> int:
        return int(self.meta[0])

    @property
    def best_score(self) -> float:
        return float(self.meta[1])

    @property
    def best_iteration(self) -> int:
        return int(self.meta[2])

    @torch.no_grad()
    def update(self, tensors: dict[str, torch.Tensor]) -> None:
        """Fold in the iterate after one more step."""
        self.meta[0] += 1
        w = 1.0 - min(self.decay, 1.0 - 1.0 / self.count)
        for k, v in tensors.items():
            self.avg[k].lerp_(v.detach(), w)

    def consider(self, iteration: int, score_of: Callable[[dict[str, torch.Tensor]], float]) -> float:
        """Score the averaged iterate and keep it if the criterion prefers it (lower is better)."""
        score = float(score_of(self.avg))
        if score <= self.best_score:  # a NaN score never replaces a snapshot
            self.meta[1], self.meta[2] = score, iteration
            for k, v in self.avg.items():
                self.best[k].copy_(v)
        return score

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint holds: restoring them in place resumes the same average and snapshot."""
        return {"tracker_meta": self.meta, **{f"avg_{k}": v for k, v in self.avg.items()},
                **{f"best_{k}": v for k, v in self.best.items()}}
