"""A measured rate's exact interval, and the prior's baseline κ from a control (docs/METHODS.md §7)."""

from __future__ import annotations

from scipy import stats

from exhume.errors import ConfigError


def _counts(successes: int, trials: int) -> None:
    if not (isinstance(successes, int) and isinstance(trials, int) and trials > 0 and 0 <= successes <= trials):
        raise ConfigError(f"a rate needs 0 ≤ successes ≤ trials and trials > 0, got {successes!r} of {trials!r}")


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper–Pearson interval of ``successes`` in ``trials`` at ``confidence`` (exact: it covers the
    true rate with at least that probability, whatever the rate)."""
    _counts(successes, trials)
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if successes == 0 else float(stats.beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(stats.beta.ppf(1.0 - tail, successes + 1, trials - successes))
    return low, high


def kappa_from_control(matched: int, total: int, confidence: float = 0.95) -> float:
    """κ from a control: ``matched`` of ``total`` never-seen records counted as reconstructed; the one-sided upper
    limit of the Clopper–Pearson interval at ``confidence`` (a bound's baseline is better too high than too low)."""
    _counts(matched, total)
    if matched == total:
        return 1.0
    return float(stats.beta.ppf(confidence, matched + 1, total - matched))
