"""The audit's budget: ``max_seconds`` is the wall time of the whole audit, its judging included.

An audit spends its budget in three parts. What does not depend on the attack runs first and is
timed: the checks of the model and data, and the membership exposure from the weights (per-record
gradients of the training images and up to ``MEMBERSHIP_NONMEMBERS`` unseen ones). The judging after
the attack (identifiability: per-record gradients at the training images and their ``n × n``
Gram matrix; the evaluation: SSIM of every candidate against the training and unseen images; the
figures and the report) is estimated before the attack from measured rates (:func:`judging_estimate`:
the membership pass's seconds per record, one float64 product's rate, two SSIM blocks, one figure)
scaled by its counts, times :data:`SAFETY`, plus :data:`RESERVE_FLOOR`. The attack gets the rest
through its own wall-clock budget (the portfolio's deadline, :mod:`exhume.portfolio.run`).

When the fixed work leaves the attack less than :data:`MIN_ATTACK_SHARE` of the budget, the attack
keeps that share and the audit takes longer than asked: one warning line says how long and which
budget would cover it. metrics.json's ``audit`` records the budget, the time before the attack, the
judging estimate, the attack's share and seconds, the judging's measured seconds and the whole wall
time. Measurements: benchmarks/README.md, "The audit's budget covers its judging".
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: seconds always kept for the judging (metrics, arrays and report written; a loaded machine's slow start)
RESERVE_FLOOR = 1.0
#: the judging estimate's factor over its measured rates (1: its parts are upper bounds already, the figures at the top of
#: their measured range; a loaded machine's rates move between the probes and the judging, which the tolerance covers)
SAFETY = 1.0
#: the attack keeps at least this share of the budget, whatever the fixed work costs (the audit then overruns, and says so)
MIN_ATTACK_SHARE = 0.5
#: the evaluation's five figures, in draws of the membership ROC timed before the attack (measured: 2.4 to 4.3 on three
#: victims, benchmarks/README.md, "The audit's budget covers its judging")
FIGURES_AFTER = 4
#: candidates matched in the SSIM probe
PROBE_CANDIDATES = 8


def since_process_start() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere 0.0), so that ``exhume audit``'s budget counts
    the interpreter's start-up, the imports and the loading of the files too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _seconds(f, *args) -> float:
    t = time.perf_counter()
    f(*args)
    return time.perf_counter() - t


def _product_rate(n: int) -> float:
    """Multiply-adds per second of one float64 ``J Jᵀ`` slice (identifiability's Gram matrix: ``n`` rows, 2¹⁶ columns)."""
    rows = max(2, min(n, 64))
    part = torch.randn(rows, 1 << 16, dtype=torch.float64)
    return rows * rows * part.shape[1] / max(_seconds(lambda: part @ part.T), 1e-6)


def _ssim_seconds_per_pair(images: torch.Tensor) -> float:
    """Seconds per (candidate, image) SSIM of the evaluation's matching: the slope between ``PROBE_CANDIDATES`` and four
    times as many candidates matched against ``images`` (a block's fixed cost, 0.1 s here, is not per pair), at least
    a quarter of the larger probe's average."""
    from exhume.evaluation.matching import best_match_blocked

    few, many = images[:PROBE_CANDIDATES].clamp(0, 1), images[:4 * PROBE_CANDIDATES].clamp(0, 1)
    t_few, t_many = _seconds(best_match_blocked, few, images), _seconds(best_match_blocked, many, images)
    average = t_many / (len(many) * len(images))
    return max((t_many - t_few) / (max(len(many) - len(few), 1) * len(images)), average / 4)


def _figure(scores: dict[str, Any]) -> tuple[float, bytes]:
    """Seconds to draw one figure, and the figure: the membership ROC, which the audit writes after the attack as drawn now
    (the plotting library's import is not timed: the judging's figures would not pay it again)."""
    import exhume.evaluation.plots  # noqa: F401  (matplotlib loaded)
    from exhume.evaluation.weights_membership import plot_roc

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "membership_roc.png"
        return _seconds(plot_roc, scores, path), path.read_bytes()


def judging_estimate(n: int, unseen: torch.Tensor, parameters: int, candidates: int, membership: tuple[float, int],
                     scores: dict[str, Any] | None) -> tuple[dict[str, float], bytes | None]:
    """The judging's seconds estimated from rates measured now (see the module docstring), by part, and the membership
    ROC figure drawn to time one figure (PNG bytes; None and no figures when ``scores`` is None: nothing is written).

    ``n``: training images; ``unseen``: the unseen images (display space); ``parameters``: the model's;
    ``candidates``: how many the attack is expected to return; ``membership``: (seconds, records) of the
    membership pass (its per-record gradients are identifiability's too); ``scores``: its scores (one figure drawn).
    """
    seconds, records = membership
    ident = n * seconds / max(records, 1) + n * n * parameters / _product_rate(n)
    pairs = candidates * (n + len(unseen)) + n * len(unseen)  # candidates against all images; the training images against the control
    evaluation = pairs * _ssim_seconds_per_pair(unseen)
    one, roc = (0.0, None) if scores is None else _figure(scores)
    parts = {"identifiability": ident, "evaluation": evaluation, "figures": FIGURES_AFTER * one}
    parts["total"] = RESERVE_FLOOR + SAFETY * sum(parts.values())
    return {k: round(v, 2) for k, v in parts.items()}, roc


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

    @property
    def covered(self) -> bool:
        return self.before + self.attack + self.estimate["total"] <= self.seconds + 1e-9

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
