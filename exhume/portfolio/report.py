"""What a person reads about a portfolio: the restart table and the starved-restart warnings."""

from __future__ import annotations

import statistics
from typing import Any


def variant_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) if overrides else "defaults"


def starved_warnings(summary: dict[str, Any]) -> list[str]:
    """One warning line per starved restart (fewer than half the median iterations of its siblings)."""
    iters = [it for it in summary.get("iterations_per_restart", []) if it is not None]
    if not summary.get("starved_restarts") or not iters:
        return []
    med = statistics.median(iters)
    return [f"warning: restart {k} ran {summary['iterations_per_restart'][k]} iterations, fewer than half the median "
            f"({med:g}) of its siblings: starved (CPU contention, or a budget too small for it)"
            for k in summary["starved_restarts"]]


def restart_rows(portfolio: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-restart table as printable cells."""
    rows = []
    for r in portfolio.get("restarts", []):
        stat = r.get("final_relative_stationarity")
        rows.append({"restart": r.get("restart"), "seed": r.get("seed"), "variant": variant_text(r.get("overrides") or {}),
                     "iterations": r.get("iterations"), "seconds": r.get("seconds"),
                     "stationarity": None if stat is None else f"{stat:.3g}",
                     "status": r.get("status", "?") + (" (reused)" if r.get("reused") else "")
                     + (f": {r['error']}" if r.get("error") else "")})
    return rows


def sizing_line(portfolio: dict[str, Any]) -> str | None:
    """How the number of restarts was chosen (a time budget with restarts="auto"), or None."""
    s = portfolio.get("sizing")
    if not s:
        return None
    rate = "no rate (the probe diverged)" if s.get("rate") is None else f"{s['rate']:.1f} iterations/s at {s['threads']} thread(s)"
    expected = "" if s.get("expected_iterations") is None else f", ~{s['expected_iterations']} iterations each"
    return (f"restarts sized by a {s['probe_seconds']:.1f}-s probe run ({rate}): {s['restarts']} restart(s) on "
            f"{s['workers']} worker(s) in the {s['seconds']:.1f} s left{expected}; {s['reason']}")


def summary_lines(summary: dict[str, Any], portfolio: dict[str, Any]) -> list[str]:
    """Lines for a terminal: the pooled count, how the restarts were sized, one line per restart, the starved warnings."""
    merged = summary.get("candidates_before_merge", 0) - summary.get("candidates", 0)
    lines = [f"pooled {summary.get('candidates')} candidates from {summary.get('restarts_complete')} of {summary.get('restarts')} "
             f"restarts ({merged} near-duplicates merged) in {summary.get('seconds', 0):.1f} s"]
    if sizing_line(portfolio):
        lines.append(sizing_line(portfolio))
    if (portfolio.get("batched") or {}).get("used"):
        lines.append(f"restarts batched in one process (exhume/portfolio/batched/): {portfolio['batched']['why']}")
    head = ("restart", "seed", "variant", "iterations", "seconds", "stationarity", "status")
    rows = [head] + [tuple("-" if row[h] is None else str(row[h]) for h in head) for row in restart_rows(portfolio)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines + starved_warnings(summary)
