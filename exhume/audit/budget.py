"""The audit's budget: ``max_seconds`` is the wall time of the whole audit, its judging included.

An audit spends its budget in three parts. What does not depend on the attack runs first and is
timed: the checks of the model and data, and the membership exposure from the weights (per-record
gradients of the training images and up to ``MEMBERSHIP_NONMEMBERS`` unseen ones). The judging after
the attack (identifiability: per-record gradients at the training images and their ``n × n``
Gram matrix; the evaluation: SSIM of every candidate against the training and unseen images; the
figures and the report) is estimated before the attack from rates measured then, scaled by its
counts (:func:`exhume.evaluation.cost.judging_estimate`). The attack gets the rest as its deadline
(:meth:`AuditBudget.attack_deadline`, handed to :func:`exhume.attack`).

When the fixed work leaves the attack less than :data:`MIN_ATTACK_SHARE` of the budget, the attack
keeps that share and the audit takes longer than asked: one warning line says how long and which
budget would cover it. metrics.json's ``audit`` records the budget, the time before the attack, the
judging estimate, the attack's share and seconds, the judging's measured seconds and the whole wall
time. Measurements: docs/defaults.md#audit-budget.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

from exhume.deadline import Deadline

#: the attack keeps at least this share of the budget, whatever the fixed work costs (the audit then overruns, and says so)
MIN_ATTACK_SHARE = 0.5


@dataclass(frozen=True)
class AuditBudget:
    """How an audit's ``seconds`` are split: measured ``before`` the attack, the judging ``estimate``, the attack's share."""

    seconds: float
    before: float
    estimate: dict[str, float]
    attack: float
    origin: str = "the call of exhume.audit"
    parts: dict[str, float] | None = None  # what ``before`` was spent on

    @classmethod
    def split(cls, seconds: float, before: float, estimate: dict[str, float], origin: str = "the call of exhume.audit",
              parts: dict[str, float] | None = None) -> AuditBudget:
        """The attack's share: what ``before`` and the estimate leave, at least ``MIN_ATTACK_SHARE`` of ``seconds``."""
        attack = max(seconds - before - estimate["total"], MIN_ATTACK_SHARE * seconds)
        parts = None if parts is None else {k: round(v, 2) for k, v in parts.items()}
        return cls(float(seconds), round(before, 2), estimate, round(attack, 2), origin, parts)

    def attack_deadline(self) -> Deadline:
        """The attack's deadline: its share from now (made when the split is, right before the attack)."""
        return Deadline.after(self.attack)

    @property
    def covered(self) -> bool:
        """Whether what came before and the estimate left the attack at least its floor. Not ``before + attack +
        estimate ≤ seconds``: ``before`` and ``attack`` are kept to 0.01 s, and their sum can round past ``seconds``."""
        return self.before + self.estimate["total"] <= (1 - MIN_ATTACK_SHARE) * self.seconds + 0.005

    def warning(self) -> str | None:
        """One line when the budget does not cover the fixed work (None when it does)."""
        if self.covered:
            return None
        fixed = self.before + self.estimate["total"]
        return (f"warning: the audit's budget of {self.seconds:g} s does not cover its fixed work ({self.before:.1f} s measured "
                f"before the attack, about {self.estimate['total']:.1f} s of judging estimated): the attack keeps "
                f"{MIN_ATTACK_SHARE:.0%} ({self.attack:.0f} s) and the audit will take about {fixed + self.attack:.0f} s; "
                f"--max-seconds {math.ceil(fixed / (1 - MIN_ATTACK_SHARE))} or more covers it")

    def record(self, attack_seconds: float | None, judging: float, wall: float, parts: dict[str, float] | None = None) -> dict[str, Any]:
        """metrics.json's ``audit.budget``: the split planned and the seconds measured (``parts``: the judging's)."""
        return {"max_seconds": self.seconds, "before_attack_seconds": self.before, "before_attack_parts": self.parts,
                "judging_estimate_seconds": self.estimate,
                "attack_budget_seconds": self.attack, "attack_seconds": None if attack_seconds is None else round(attack_seconds, 1),
                "judging_seconds": round(judging, 1), "judging_parts": {k: round(v, 2) for k, v in (parts or {}).items()},
                "wall_seconds": round(wall, 1), "covered": self.covered,
                "counted_from": self.origin,
                "definition": "the whole audit's wall time is max_seconds: the checks and the membership exposure first "
                              "(before_attack), then the attack within attack_budget, then the judging the estimate kept aside"}

    def announce(self, progress: bool) -> None:
        """The split on stdout (with ``progress``), the warning on stderr (always)."""
        line = self.warning()
        if line:
            print(line, file=sys.stderr)
        elif progress:
            print(f"audit budget {self.seconds:g} s: {self.before:.1f} s before the attack, {self.attack:.1f} s of attack, "
                  f"{self.estimate['total']:.1f} s kept for the judging")
