"""The audit of a model trained with differential privacy (``exhume audit --dp-epsilon E``; docs/audit.md).

The informed adversary run on the owner's own model and data (``dp_targets`` targets, every other record known:
the first layer's read or kkt's ranking, and the candidate game on the unseen images), each rate beside the bound for the owner's mechanism
(σ, q, T where stated, else (ε, δ)); exhume's reference curve only as context, labelled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from exhume.audit.curve import load_curve, read_at

#: the reference curve the audit reads as context (``dp-curve.json`` of ``exhume experiment dp`` at its CPU default)
MEASURED = Path(__file__).with_name("dp_measured.json")
#: an ε within this factor of a measured one reads that point alone
SAME_EPSILON = 1.1
LEVELS_NOT_PRIVATE = ("none", "clip")
#: the candidate games played, where the unseen images allow (k − 1 of them beside each target)
GAMES = (2, 8, 100)


def load_measured(path: Path = MEASURED) -> dict[str, Any]:
    """The reference curve (checked: its points and provenance)."""
    return load_curve(path, "the DP reference curve (dp-curve.json of exhume experiment dp)", ("points", "settings", "measured_on", "date", "command"))


def reference_reading(epsilon: float, start_known: bool, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"status", "reading", …}``: the informed game's rate (k = 8) and the uninformed memorised fraction exhume measured on
    its reference victim of the same threat model at ``epsilon`` (status ``"read"``), or why there is none."""
    from exhume.errors import DataError

    try:
        table = load_measured() if table is None else table
    except DataError as e:
        return {"status": "no reference curve", "reading": f"no reference reading: {e}"}
    source = {k: table[k] for k in ("measured_on", "date", "command")}
    setting = next((name for name, s in table["settings"].items() if bool(s.get("start_known")) == start_known), None)
    points = sorted((p for p in table["points"] if p["setting"] == setting and p["level"] not in LEVELS_NOT_PRIVATE),
                    key=lambda p: p["epsilon"])
    if setting is None or not points:
        return {"status": "threat model not measured", "reading": "no reference reading: exhume measured no reference victim "
                f"with {'the start known' if start_known else 'the weights alone'}", **source}
    lo, hi = points[0]["epsilon"], points[-1]["epsilon"]
    if not lo / SAME_EPSILON <= epsilon <= hi * SAME_EPSILON:
        return {"status": "outside the measured range", "reading": f"no reference reading: ε = {epsilon:g} lies outside the "
                f"measured {lo:g}–{hi:g}: no extrapolation", "setting": setting, **source}
    flat = [{"epsilon": p["epsilon"], "fraction": p["uninformed"]["rate"] if "uninformed" in p else p["fraction"],
             "named": p.get("game_8", {}).get("rate")} for p in points]
    percent, at, amount = read_at(flat, "epsilon", epsilon, SAME_EPSILON)
    where = f"at ε = {at[0]:.3g}" if at[0] == at[1] else f"between ε = {at[0]:.3g} and {at[1]:.3g}"
    what = table["settings"][setting].get("what", setting)
    games = [p["named"] for p in flat if at[0] <= p["epsilon"] <= at[1] and p["named"] is not None]
    low, high = (round(100 * min(games)), round(100 * max(games))) if games else (0, 0)
    game = "" if not games else f"; the informed game at k = 8 named {low} %" if low == high else f"; the informed game at k = 8 named {low}–{high} %"
    text = (f"context, not your model: on exhume's reference victim ({what}; {source['measured_on']}) {where} the uninformed kkt "
            f"memorised {amount} of the training images{game} ({source['date']}, `{source['command']}`)")
    return {"status": "read", "reading": text, "percent": percent, "at_epsilons": at, "setting": setting, **source}


def _splits(unseen: int, targets: int) -> tuple[int, int]:
    """``(controls, distractors)`` taken from the unseen images; the rest (at least half) is the pool."""
    return min(targets, unseen // 4), min(max(GAMES) - 1, unseen // 4)


def _labels_for(data, x: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
    """Labels of ``x`` in exhume's convention: the given ones, else the model's own predictions."""
    if given is not None:
        return given
    with torch.no_grad():
        out = data.view.model((x - data.view.mean).float())
    if data.info["task"] == "binary":
        return torch.where(out.reshape(len(x), -1)[:, -1] > 0, 1.0, -1.0)
    return out.argmax(-1)


def informed_adversary(data, recon, cfg) -> dict[str, Any]:
    """The informed adversary on the owner's model and data: ``cfg.dp_targets`` targets (seeded), each with every other
    training record known; targets reconstructed by the audit's attack with the known records (where it uses them),
    controls matched the same way, and the candidate games' wins (module docstring)."""
    import exhume
    from exhume.attacks import attack_class, attack_using
    from exhume.evaluation.informed import game_wins, rate, reconstructed
    from exhume.request import ThreatModel, view_of

    n, gen = len(data.x), np.random.default_rng(cfg.seed)
    targets = sorted(gen.choice(n, min(cfg.dp_targets, n - 1), replace=False).tolist())
    order = gen.permutation(len(data.unseen))
    controls, distractors = _splits(len(data.unseen), len(targets))
    ctrl, others, pool = (data.unseen[order[:controls]], order[controls:controls + distractors], data.unseen[order[controls + distractors:]])
    labelled = data.unseen_y is not None
    cand_y = _labels_for(data, data.unseen[others], data.unseen_y[others] if labelled else None)
    games = tuple(k for k in GAMES if k - 1 <= distractors)
    ranks = "known" in attack_class(cfg.method).uses_records
    hits = matched = 0
    wins = dict.fromkeys(games, 0)
    for i, t in enumerate(targets):
        rest = [j for j in range(n) if j != t]
        view = view_of(data.view, ThreatModel(known_records=(data.x[rest], data.y[rest])))
        if ranks:
            ranked = attack_class(cfg.method).of_settings(cfg.attack_args).informed(view, recon)
            named = ranked.candidates[:ranked.record.settings.get("informed_named", 1)]
            hits += int(reconstructed(data.x[t:t + 1], named, pool)[0])
            matched += int(i < controls and reconstructed(ctrl[i:i + 1], named, pool)[0])
        member_y = data.y[t:t + 1] if labelled else _labels_for(data, data.x[t:t + 1], None)
        if games:
            cand = (torch.cat([data.x[t:t + 1], data.unseen[others]]), torch.cat([member_y.to(cand_y.dtype), cand_y]))
            played = exhume.attack(view, attack_using("candidates"), restarts=1, progress=False, candidates=cand, multipliers="free")
            shares = np.asarray(played.record.extras["scores"])
            for k, won in game_wins(shares[0], shares[1:], games).items():
                wins[k] += int(won)
    return {"targets": len(targets), "labels": "given" if labelled else "the model's predictions (no unseen labels given)",
            "reconstructed": rate(hits, len(targets)) if ranks else None,
            "controls": rate(matched, controls) if ranks and controls else None,
            "games": {str(k): rate(w, len(targets)) for k, w in wins.items()}, "pool": len(pool), "distractors": int(distractors)}


def mechanism_bound(cfg, kappa: float) -> dict[str, Any]:
    """The bound at ``kappa`` for the owner's mechanism: exact from σ, q, T where stated, else from (ε, δ) alone."""
    from exhume.privacy import dp_bound, rero_bound

    if cfg.dp_noise_multiplier is not None:
        b = rero_bound(cfg.dp_noise_multiplier, cfg.dp_sample_rate, int(cfg.dp_steps), kappa)
        return {"value": b.value, "low": b.low, "kappa": kappa, "from": f"your mechanism (σ = {cfg.dp_noise_multiplier:g}, "
                f"q = {cfg.dp_sample_rate:g}, T = {cfg.dp_steps}): Hayes et al. (2023), {b.method}"}
    value = dp_bound(cfg.dp_epsilon, cfg.dp_delta, kappa)
    return {"value": value, "low": None, "kappa": kappa, "from": f"(ε, δ) = ({cfg.dp_epsilon:g}, {cfg.dp_delta:g}) alone: the "
            "(ε, δ) trade-off curve (give --dp-noise-multiplier, --dp-sample-rate and --dp-steps for your mechanism's own)"}


def dp_record(cfg, data, recon, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics.json``'s ``dp``: the stated budget, the informed adversary's rates with their bounds, the context."""
    from exhume.privacy import kappa_from_control

    informed = informed_adversary(data, recon, cfg)
    controls = informed["controls"]
    kappa = kappa_from_control(controls["successes"], controls["trials"]) if controls else 1.0
    bounds = {"reconstructed": mechanism_bound(cfg, kappa), **{k: mechanism_bound(cfg, 1.0 / int(k)) for k in informed["games"]}}
    mech = None if cfg.dp_noise_multiplier is None else {"noise_multiplier": cfg.dp_noise_multiplier,
                                                          "sample_rate": cfg.dp_sample_rate, "steps": cfg.dp_steps}
    record = {"epsilon": cfg.dp_epsilon, "delta": cfg.dp_delta, "mechanism": mech, "informed": informed, "bounds": bounds,
              "kappa": round(kappa, 5), "kappa_definition": "the rate at which the informed adversary's reconstruction matches a "
              "record the model never saw (upper end of its 95 % Clopper–Pearson interval); 1/k in the game",
              "context": reference_reading(cfg.dp_epsilon, data.view.start is not None),
              "verdict_meaning": meaning(str(metrics.get("verdict")), cfg.dp_epsilon)}
    return {**record, "lines": dp_lines(record).splitlines()}


def meaning(verdict: str, epsilon: float) -> str:
    """What the verdict of the uninformed audit does and does not mean beside the informed adversary's lines."""
    if verdict == "leaks":
        return f"the uninformed attack reconstructed training images although the model was trained with DP at ε = {epsilon:g}"
    if verdict == "no evidence":
        return ("'no evidence' is the uninformed attack's failure within its budget, not a proof that nothing can be "
                "reconstructed: the informed adversary's lines and the bound say what DP itself allows")
    return "the verdict is inconclusive (an assumption of the attack failed), so it says nothing of the leak"


def _rate(r: dict[str, Any]) -> str:
    return (f"{r['successes']} of {r['trials']} ({100 * r['rate']:.0f} %, 95 % interval {100 * r['low']:.0f}–"
            f"{100 * r['high']:.0f} %)")


def dp_lines(dp: dict[str, Any]) -> str:
    """The audit summary's lines on differential privacy: one per measured success beside its bound."""
    inf, b = dp["informed"], dp["bounds"]
    lines = [f"dp: trained with DP-SGD at ε = {dp['epsilon']:g}, δ = {dp['delta']:g} (as stated); the informed adversary knows "
             f"every training record but its target ({inf['targets']} targets; labels: {inf['labels']}); {dp['verdict_meaning']}"]
    if inf["reconstructed"] is not None:
        lines.append(f"dp, informed: targets reconstructed {_rate(inf['reconstructed'])}; bound {b['reconstructed']['value']:.3g} "
                     f"at κ = {dp['kappa']:.3g} for {b['reconstructed']['from']}")
    for k, r in inf["games"].items():
        lines.append(f"dp, informed: the candidate game at k = {k} (the target among {k} records, one trained on) named "
                     f"{_rate(r)}, chance {100 / int(k):.3g} %; bound {b[k]['value']:.3g} for {b[k]['from']}")
    lines.append(f"dp, {dp['context'].get('reading', 'no reference reading')}")
    return "\n".join(lines)
