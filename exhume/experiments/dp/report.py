"""``exhume experiment dp``'s outputs: the markdown table, the figure, and the files (CSV, JSON, the curve)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from exhume.experiments.dp.cells import METHOD
from exhume.experiments.dp.cli import CLIP_ONLY, NON_PRIVATE, SETTINGS, SIGMA
from exhume.experiments.dp.pooling import private
from exhume.experiments.registry import write_csv


def eps_text(epsilon: float) -> str:
    """An ε as the table writes it: 1.2e+07, 10,000, 1,000, 9.99, 1."""
    return f"{epsilon:.2g}" if epsilon >= 1e5 else f"{epsilon:,.0f}" if epsilon >= 10 else f"{epsilon:.3g}"


def label(level: str, spent: float | None = None) -> str:
    """A level in words: ∞, clipping only, a target ε, or a noise multiplier with the ε the accountant spent."""
    if level.startswith(SIGMA):
        return f"{eps_text(spent)} (σ = {level[len(SIGMA):]})"
    named = {NON_PRIVATE: "∞ (not private)", CLIP_ONLY: "clipping only (∞)"}
    return named[level] if level in named else eps_text(float(level))


def cell(r: dict[str, Any], bound: dict[str, float] | None = None) -> str:
    """A rate as ``s/t [low, high]``, with its bound beside it (``≤ b``)."""
    text = f"{r['successes']}/{r['trials']} [{r['low']:.2f}, {r['high']:.2f}]"
    return text if bound is None else f"{text} ≤ {bound['value']:.3g}"


def table(points: list[dict], games: list[int]) -> str:
    """The markdown table of the pooled points: each rate with its 95 % interval, beside its bound."""
    head = ["setting", "ε", "σ", "test acc", "uninformed: memorised / n", "informed: targets reconstructed ≤ bound",
            *(f"game k = {k} ≤ bound" for k in games)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        lines.append(f"| {p['setting']} | {label(p['level'], p['epsilon'])} | {p['noise_multiplier']:.3g} | {p['test_accuracy']:.3f} | "
                     f"{cell(p['uninformed'])} (control {p['uninformed_control']['successes']}) | "
                     f"{cell(p['informed'], p['bound_informed'])} (control {p['informed_control']['successes']}) | "
                     + " | ".join(cell(p[f"game_{k}"], p[f"bound_game_{k}"]) for k in games) + " |")
    return "\n".join(lines)


def figure(points: list[dict], games: list[int], path: Path) -> None:
    """Success against ε (log x), one panel per setting: uninformed and informed rates with their intervals, the game at the
    middle k, and the exact bounds beside them; ε = ∞ as horizontal lines."""
    from exhume.evaluation.plots import subplots

    settings = list(dict.fromkeys(p["setting"] for p in points))
    fig, axes = subplots(1, len(settings), figsize=(5.4 * len(settings), 3.8), squeeze=False)
    k = games[len(games) // 2]
    for ax, setting in zip(axes[0], settings):
        noisy = private(points, setting)
        eps = [p["epsilon"] for p in noisy]
        for key, style, color, what in (("uninformed", "o-", "C0", "uninformed (kkt, weights)"),
                                        ("informed", "s-", "C1", "informed: target reconstructed"),
                                        (f"game_{k}", "^-", "C2", f"informed: game k = {k}")):
            rates = [p[key] for p in noisy]
            ax.errorbar(eps, [r["rate"] for r in rates], yerr=[[r["rate"] - r["low"] for r in rates], [r["high"] - r["rate"] for r in rates]],
                        fmt=style, color=color, ms=4, capsize=2, label=what)
        ax.plot(eps, [p["bound_informed"]["value"] for p in noisy], "--", color="C1", lw=1, label="bound (Hayes et al.), κ = control")
        ax.plot(eps, [p[f"bound_game_{k}"]["value"] for p in noisy], "--", color="C2", lw=1, label=f"bound, κ = 1/{k}")
        ax.axhline(1.0 / k, ls=":", color="grey", lw=1, label=f"chance 1/{k}")
        for p in (p for p in points if p["setting"] == setting and p["level"] == NON_PRIVATE):
            ax.axhline(p["informed"]["rate"], ls="-", color="k", lw=0.8, label=f"ε = ∞, informed: {p['informed']['rate']:.2f}")
        ax.set(xscale="log", xlabel="ε (δ = 1e-5)", ylabel="success rate", ylim=(-0.03, 1.03), title=f"{setting}: {SETTINGS[setting]['what']}")
        ax.legend(fontsize=6, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(rows: list[dict], points: list[dict], found: dict, s: dict, out: Path, command: str, seconds: float) -> dict[str, Any]:
    """``dp.csv`` (rows), ``dp.md`` (the table), ``dp.png``, ``dp-curve.json`` (the points, for the audit's context) and
    ``dp.json`` (everything); returns the summary."""
    from exhume.files.jsonio import write_json

    write_csv(out / "dp.csv", [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows])
    text = table(points, s["games"])
    (out / "dp.md").write_text(text + "\n")
    figure(points, s["games"], out / "dp.png")
    measured_on = (f"bundled MNIST odd/even, n = {s['n']}, seed(s) {', '.join(map(str, s['seeds']))}; {s['restarts']} kkt run(s) of "
                   f"{s['iterations']} iterations per victim, {s['targets']} informed targets per victim, clipping norm "
                   f"{s['max_grad_norm']:g}, δ = {s['delta']:g}")
    write_json(out / "dp-curve.json", {"what": "exhume's reference victims trained with DP-SGD against the target ε: the memorised "
                                       "fraction (uninformed kkt), targets reconstructed and the candidate game (informed)",
                                       "method": METHOD, "settings": {k: SETTINGS[k] for k in s["settings"]}, "measured_on": measured_on,
                                       "date": datetime.date.today().isoformat(), "command": command, "run_settings": s,
                                       "points": points, "findings": found})
    summary = {"experiment": "dp", "settings": s, "command": command, "seconds": round(seconds, 1), "points": points,
               "findings": found, "table": text,
               "files": {k: str(out / v) for k, v in (("table_csv", "dp.csv"), ("table_md", "dp.md"), ("table_json", "dp.json"),
                                                      ("figure", "dp.png"), ("curve", "dp-curve.json"))}}
    write_json(out / "dp.json", {**summary, "rows": rows})
    return summary
