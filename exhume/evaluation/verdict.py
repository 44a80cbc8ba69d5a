"""The verdict of an evaluation, in one place: leaks / no evidence / inconclusive, with its reason.

The null hypothesis is the evaluator's held-out control: the memorisation test (a candidate
beats every unseen pool image) run on unseen images (non-members) in place of the training
images. **leaks**: the training images pass it significantly more often than the control
(one-sided Fisher exact test, ``p < alpha``, ``alpha = 0.05`` by default). Evidence of a leak
stands whatever else went wrong, since the test controls for chance.

Otherwise: **inconclusive** when the attack's assumptions fail (``failures``: the victim far
from a stationary point, the attack's own residual high, layers the attack does not model, no
control measured) or the unseen images cannot show it (exact copies of training images among
them, a pool under ``MIN_POOL`` or a control under ``MIN_CONTROL`` images), since an attack that
finds nothing then says little; **no evidence** when they hold. "No evidence" is never a clean
bill of health: it says that this attack, with this budget, found nothing significant; a
stronger attack may.
"""

from __future__ import annotations

from typing import Any

from exhume.errors import ConfigError

ALPHA = 0.05
VERDICTS = ("leaks", "no evidence", "inconclusive")
#: below these sizes a count of zero says little: a tiny pool is beaten by any close-enough
#: candidate, a tiny control cannot show a difference (for comparison: the demo's pool is 1000
#: images, its control 100)
MIN_POOL = 100
MIN_CONTROL = 10


def check_alpha(alpha) -> float:
    """``alpha`` as a float, refused unless it is a significance level strictly between 0 and 1."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError(f"alpha {alpha!r}: expected a significance level between 0 and 1 (e.g. 0.05)") from None
    if not 0.0 < value < 1.0:
        raise ConfigError(f"alpha {alpha!r}: expected a significance level strictly between 0 and 1 (e.g. 0.05)")
    return value


def fisher_p(memorised: int, n: int, control: int, n_control: int) -> float:
    """One-sided Fisher exact p-value that ``memorised / n`` exceeds ``control / n_control``."""
    from scipy.stats import fisher_exact

    return float(fisher_exact([[memorised, n - memorised], [control, n_control - control]], alternative="greater")[1])


def decide(metrics: dict[str, Any], failures: list[str] | None = None, alpha: float = ALPHA) -> dict[str, Any]:
    """The verdict for ``metrics`` (from :func:`exhume.evaluation.evaluate_images` plus the control).

    Returns ``{"verdict", "reason", "p_value", "alpha", "counts", "assumption_failures"}``.
    """
    failures = list(failures or [])
    k, n = metrics.get("memorised"), metrics.get("n_train")
    c, nc = metrics.get("memorised_control"), metrics.get("control_size")
    counts = {"memorised": k, "n_train": n, "memorised_control": c, "control_size": nc, "pool_size": metrics.get("pool_size")}
    p = None
    if k is None:
        failures.append("no memorisation count: the evaluation had no pool of unseen images")
    elif c is None or not nc:
        failures.append("no held-out control was measured, so the count cannot be compared with non-members")
    else:
        p = fisher_p(k, n, c, nc)
    failures += _unseen_failures(metrics)
    out = {"verdict": "", "reason": "", "p_value": p, "alpha": alpha, "test": "one-sided Fisher exact test, memorised vs control",
           "counts": counts, "assumption_failures": failures}
    if p is not None and p < alpha and k > 0:
        out["verdict"] = "leaks"
        out["reason"] = (f"{k} of {n} training images were reconstructed closer than any of {counts['pool_size']} unseen images, "
                         f"against {c} of {nc} unseen control images (p = {p:.2g} < {alpha:g}).")
    elif failures:
        out["verdict"] = "inconclusive"
        found = "" if p is None else f"The attack found no significant leak ({k} of {n} against {c} of {nc} in the control, p = {p:.2g}), but "
        out["reason"] = (found + ("this says little because " if found else "Inconclusive because ")
                         + "; ".join(failures) + ".")
    else:
        out["verdict"] = "no evidence"
        out["reason"] = (f"{k} of {n} training images against {c} of {nc} unseen control images (p = {p:.2g} ≥ {alpha:g}): "
                         "no evidence of leakage from this attack and budget. This is not proof that the model does not leak; "
                         "a stronger or longer attack may find some.")
    return out


def _unseen_failures(metrics: dict[str, Any]) -> list[str]:
    """What makes the unseen images (pool and control) unfit to show that nothing leaks."""
    out = []
    copies = int(metrics.get("pool_exact_copies_of_train") or 0) + int(metrics.get("control_exact_copies_of_train") or 0)
    if copies:
        out.append(f"{copies} of the unseen images (pool and control) are exact copies of training images, so they are not "
                   "unseen: a copy in the pool hides its training image from the test, one in the control inflates it; give "
                   "images the model never saw")
    pool, control = metrics.get("pool_size"), metrics.get("control_size")
    if pool is not None and pool < MIN_POOL:
        out.append(f"the pool holds only {pool} unseen images (at least {MIN_POOL} are needed for beating the best of them to "
                   "mean much); give more unseen images")
    if control is not None and control < MIN_CONTROL:
        out.append(f"the control holds only {control} unseen images (at least {MIN_CONTROL} are needed to compare with); "
                   "give more unseen images")
    return out
