"""``exhume experiment dp``'s rows with their bounds, pooled over seeds into points with exact intervals."""

from __future__ import annotations

from typing import Any

from exhume.experiments.dp.cli import CLIP_ONLY, NON_PRIVATE


def with_bounds(rows: list[dict], games: list[int]) -> list[dict]:
    """Each row with its bounds at its recorded (σ, q, T): the free reconstruction's at κ the setting's control (pooled
    over its victims, the upper end of its 95 % interval; uninformed and informed apart), each game's at κ = 1/k."""
    from exhume.privacy import kappa_from_control

    kappas = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        group = [r for r in rows if r["setting"] == setting]
        kappas[setting] = (kappa_from_control(sum(r["control"] for r in group), sum(r["control_size"] for r in group)),
                           kappa_from_control(sum(r["controls_matched"] for r in group), sum(r["targets"] for r in group)))
    out = []
    for r in rows:
        plain, informed = kappas[r["setting"]]
        bound = {"kappa": round(plain, 5), "kappa_informed": round(informed, 5),
                 "bound": _bound(r, plain), "bound_informed": _bound(r, informed),
                 **{f"bound_game_{k}": _bound(r, 1.0 / k) for k in games}}
        out.append({**r, **bound})
    return out


def _bound(row: dict, kappa: float) -> dict[str, float]:
    """Hayes et al.'s bound for the row's mechanism at ``kappa`` (1 without noise), with the interval the exact value lies in."""
    from exhume.privacy import rero_bound

    if not (row["noise_multiplier"] or 0) > 0:
        return {"value": 1.0, "low": 1.0}
    b = rero_bound(row["noise_multiplier"], row["sample_rate"], int(row["steps"]), kappa)
    return {"value": b.value, "low": b.low}


def curve(rows: list[dict], games: list[int]) -> list[dict]:
    """The rows pooled over seeds: one point per (setting, level), each rate with its 95 % Clopper–Pearson interval."""
    from exhume.evaluation.informed import rate

    points: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        points.setdefault((r["setting"], r["level"]), []).append(r)
    out = []
    for (setting, level), group in points.items():
        spent = [r["epsilon_spent"] for r in group if r.get("epsilon_spent") is not None]
        targets = sum(r["targets"] for r in group)
        first = group[0]
        out.append({"setting": setting, "level": level, "epsilon": sum(spent) / len(spent) if spent else None, "runs": len(group),
                    "noise_multiplier": first["noise_multiplier"], "sample_rate": first["sample_rate"], "steps": first["steps"],
                    "test_accuracy": _mean(group, "test_accuracy"), "membership_auc": _mean(group, "membership_auc"),
                    "uninformed": rate(sum(r["memorised"] for r in group), sum(r["n"] for r in group)),
                    "uninformed_control": rate(sum(r["control"] for r in group), sum(r["control_size"] for r in group)),
                    "leaks": sum(r["verdict"] == "leaks" for r in group),
                    "informed": rate(sum(r["reconstructed"] for r in group), targets),
                    "informed_control": rate(sum(r["controls_matched"] for r in group), targets),
                    **{f"game_{k}": rate(sum(r[f"game_{k}"] for r in group), targets) for k in games},
                    **{k: first[k] for k in first if k.startswith(("bound", "kappa"))}})
    return out


def _mean(group: list[dict], key: str) -> float:
    return round(sum(r[key] for r in group) / len(group), 4)


def private(points: list[dict], setting: str) -> list[dict]:
    """The setting's points with noise, by ε from the smallest."""
    return sorted((p for p in points if p["setting"] == setting and p["level"] not in (NON_PRIVATE, CLIP_ONLY)),
                  key=lambda p: p["epsilon"])


def findings(points: list[dict], games: list[int]) -> dict[str, Any]:
    """Per setting and informed measure (targets reconstructed, each game): whether its interval reaches under its bound at
    every level, whether its rate is at or above the uninformed memorised fraction at every level, the largest ε at which
    it is not above chance (its interval holds 1/k; for reconstruction the control's rate), and its ratio to its bound at
    ε ≤ 100."""
    keys = ("informed", *(f"game_{k}" for k in games))
    out: dict[str, Any] = {}
    for setting in dict.fromkeys(p["setting"] for p in points):
        pts = [p for p in points if p["setting"] == setting]
        noisy = private(points, setting)
        out[setting] = {key: {
            "under_bound_everywhere": all(p[key]["low"] <= p[f"bound_{key}"]["value"] + 1e-12 for p in pts),
            "at_or_above_uninformed_everywhere": all(p[key]["rate"] >= p["uninformed"]["rate"] for p in pts),
            "chance_at_or_below_epsilon": max((p["epsilon"] for p in noisy if p[key]["low"] <= _chance(p, key)), default=None),
            "ratio_to_bound": {f"{p['epsilon']:.3g}": round(p[key]["rate"] / p[f"bound_{key}"]["value"], 4)
                               for p in noisy if p["epsilon"] <= 110}} for key in keys}
    return out


def _chance(point: dict, key: str) -> float:
    """The measure's baseline: 1/k for the game at k, the control's rate for reconstruction."""
    return 1.0 / int(key.split("_")[1]) if key.startswith("game_") else point["informed_control"]["rate"]
