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
finds nothing then says little, or the attack's equation admits other images that fit the weights
better than the training images do (:mod:`exhume.evaluation.identifiability`: finding none of them
proves nothing); **no evidence** when they hold. The owner's audit adds its identifiability and
membership-from-the-weights findings to the reason. "No evidence" is never a clean
bill of health: it says that this attack, with this budget, found nothing significant; a
stronger attack may.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exhume.errors import ConfigError
from exhume.evaluation.identifiability import identifiability_failure, identifiability_line

ALPHA = 0.05
VERDICTS = ("leaks", "no evidence", "inconclusive")
TEST = "one-sided Fisher exact test, memorised vs control"
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


@dataclass(frozen=True)
class Counts:
    """The counts a verdict compares: the training images' memorisation count against the control's."""

    memorised: int | None
    n_train: int | None
    memorised_control: int | None
    control_size: int | None
    pool_size: int | None

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> Counts:
        return cls(metrics.get("memorised"), metrics.get("n_train"), metrics.get("memorised_control"),
                   metrics.get("control_size"), metrics.get("pool_size"))


@dataclass(frozen=True)
class Verdict:
    """leaks / no evidence / inconclusive, its reason in plain words, and the test behind it."""

    verdict: str
    reason: str
    p_value: float | None
    alpha: float
    counts: Counts
    assumption_failures: list[str] = field(default_factory=list)
    test: str = TEST


def decide(metrics: Mapping[str, Any], failures: list[str] | None = None, alpha: float = ALPHA) -> Verdict:
    """The verdict for ``metrics`` (from :func:`exhume.evaluation.evaluate_images` plus the control)."""
    failures = list(failures or [])
    counts = Counts.of(metrics)
    k, n, c, nc = counts.memorised, counts.n_train, counts.memorised_control, counts.control_size
    p = None
    if k is None:
        failures.append("no memorisation count: the evaluation had no pool of unseen images")
    elif c is None or not nc:
        failures.append("no held-out control was measured, so the count cannot be compared with non-members")
    else:
        p = fisher_p(k, n, c, nc)
    failures += _unseen_failures(metrics)
    failures += identifiability_failure(metrics.get("identifiability"))
    if p is not None and p < alpha and k > 0:
        word = "leaks"
    else:
        word = "inconclusive" if failures else "no evidence"
    reason = _reason(word, counts, p, alpha, failures) + _owner_findings(metrics, word)
    threat = metrics.get("threat_model")
    if threat:  # the promise is about one threat model: name it
        reason += f" Threat model audited: {threat}."
    return Verdict(word, reason, p, alpha, counts, failures)


def _reason(word: str, counts: Counts, p: float | None, alpha: float, failures: list[str]) -> str:
    """The verdict in plain words, with the counts and the p-value behind it."""
    k, n, c, nc = counts.memorised, counts.n_train, counts.memorised_control, counts.control_size
    if word == "leaks":
        return (f"{k} of {n} training images were reconstructed closer than any of {counts.pool_size} unseen images, "
                f"against {c} of {nc} unseen control images (p = {p:.2g} < {alpha:g}).")
    if word == "inconclusive":
        found = "" if p is None else f"The attack found no significant leak ({k} of {n} against {c} of {nc} in the control, p = {p:.2g}), but "
        return found + ("this says little because " if found else "Inconclusive because ") + "; ".join(failures) + "."
    return (f"{k} of {n} training images against {c} of {nc} unseen control images (p = {p:.2g} ≥ {alpha:g}): "
            "no evidence of leakage from this attack and budget. This is not proof that the model does not leak; "
            "a stronger or longer attack may find some.")


def _owner_findings(metrics: Mapping[str, Any], word: str) -> str:
    """The identifiability (unless the failures already state it), membership and layers' span findings, as sentences of the reason."""
    ident, out = metrics.get("identifiability"), ""
    line = identifiability_line(ident)
    if line and not (word == "inconclusive" and ident.get("admits_other_images")):
        out += f" Identifiability: {line}."
    exposure = metrics.get("membership_exposure")
    if exposure and exposure.get("finding"):
        out += " " + exposure["finding"]
    layers = metrics.get("layers")
    if layers and layers.get("finding"):
        out += " " + layers["finding"]
    return out


def _unseen_failures(metrics: Mapping[str, Any]) -> list[str]:
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
