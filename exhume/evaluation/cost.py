"""What judging a reconstruction will cost, estimated before the attack from rates measured on the spot.

A run that must end within a wall-clock budget, its judging included (``exhume audit``, ``exhume
demo``), keeps aside what the judging after the attack will take: the evaluation's SSIM matching
(every candidate against the training and unseen images: a rate per pair from two blocks matched
now), its figures (one figure drawn now), and for the audit the owner-side identifiability
(per-record gradients at the training images, at the membership pass's measured rate, and their
``n × n`` Gram matrix at a measured float64 rate). Each part is the measured rate times its count;
the total adds :data:`RESERVE_FLOOR`. :func:`since_process_start` is the clock a command's budget
counts on. Measurements: docs/defaults.md#audit-judging-estimate.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

#: seconds always kept for the judging (metrics, arrays and report written; a loaded machine's slow start)
RESERVE_FLOOR = 1.0
#: the judging estimate's factor over its measured rates (1: its parts are upper bounds already, the figures at the top of
#: their measured range; a loaded machine's rates move between the probes and the judging, which the tolerance covers)
SAFETY = 1.0
#: the evaluation's five figures, in draws of the membership ROC timed before the attack (measured: 2.4 to 4.3 on three
#: victims, docs/defaults.md)
FIGURES_AFTER = 4
#: candidates matched in the SSIM probe
PROBE_CANDIDATES = 8
#: at least this many images in the SSIM probe (copies of the few given)
PROBE_IMAGES = 256


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

    if len(images) == 0:
        return 0.0
    best_match_blocked(images[:2].clamp(0, 1), images[:2].clamp(0, 1))  # the first call's set-up, not per pair
    if len(images) < PROBE_IMAGES:  # a block of few columns is mostly its fixed cost: match against copies
        images = images.repeat(-(-PROBE_IMAGES // len(images)), *([1] * (images.dim() - 1)))[:PROBE_IMAGES]
    few, many = images[:PROBE_CANDIDATES].clamp(0, 1), images[:4 * PROBE_CANDIDATES].clamp(0, 1)
    t_few, t_many = _seconds(best_match_blocked, few, images), _seconds(best_match_blocked, many, images)
    average = t_many / (len(many) * len(images))
    return max((t_many - t_few) / (max(len(many) - len(few), 1) * len(images)), average / 4)


def figure(scores: dict[str, Any]) -> tuple[float, bytes]:
    """Seconds to draw one figure once the plotting library is warm, and the figure: the membership ROC, drawn twice (the
    first draw loads the library and its fonts, which the judging's figures do not pay again; it is the one returned)."""
    from exhume.evaluation.weights_membership import plot_roc

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "membership_roc.png"
        plot_roc(scores, path)
        png = path.read_bytes()
        return _seconds(plot_roc, scores, path), png


def evaluation_estimate(n: int, images: torch.Tensor, unseen: int, candidates: int) -> dict[str, float]:
    """The seconds of an evaluation's matching and figures (``exhume demo``'s): ``candidates`` against ``n`` training and
    ``unseen`` pool and control images, the SSIM rate measured on ``images``, one figure drawn (a ROC of as many scores)."""
    import numpy as np

    rng = np.random.default_rng(0)
    scores = {"loss_members": rng.random(n), "loss_nonmembers": rng.random(unseen)}
    return _with_total({"evaluation": _matching_seconds(n, unseen, candidates, images), "figures": FIGURES_AFTER * figure(scores)[0]})


def _matching_seconds(n: int, unseen: int, candidates: int, images: torch.Tensor) -> float:
    """The evaluation's SSIM matching: every candidate against the training and unseen images, the training images
    against the control, at the rate measured on ``images``."""
    return (candidates * (n + unseen) + n * unseen) * _ssim_seconds_per_pair(images)


def _with_total(parts: dict[str, float]) -> dict[str, float]:
    """``parts`` and their ``total`` (with :data:`RESERVE_FLOOR`), rounded to hundredths."""
    parts["total"] = RESERVE_FLOOR + SAFETY * sum(parts.values())
    return {k: round(v, 2) for k, v in parts.items()}


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
    evaluation = _matching_seconds(n, len(unseen), candidates, unseen)
    one, roc = (0.0, None) if scores is None else figure(scores)
    return _with_total({"identifiability": ident, "evaluation": evaluation, "figures": FIGURES_AFTER * one}), roc
