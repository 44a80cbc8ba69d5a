"""``exhume experiment selection``: is the attacker-side score an honest guide?

Across the completed trials of an ``exhume tune`` study, the evaluator (who has the training set)
counts, for each trial's reconstruction, the training images recovered at SSIM ≥ 0.4 one-to-one
and the memorised ones (docs/METHODS.md §4) — these are ORACLE numbers, used here only to judge the
selection, never by the tuner. The experiment reports the Spearman rank correlation between the
attacker-side score (and each of its components) and those counts, and the oracle counts of the
trial the attacker selects (highest score) against the best trial in hindsight and the default
settings (trial 0).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from exhume.attacks.base import DEFAULT_METHOD
from exhume.errors import ConfigError
from exhume.experiments.registry import register_experiment

HELP = ("rank correlation between the tuner's attacker-side score and the oracle counts (SSIM>=0.4, memorised) across "
        "the trials of a study, and the oracle count of the attacker-selected trial vs the best one. With --study-dir it "
        "judges an existing 'exhume tune' folder; without, it trains the demo victim for 30 s and tunes 8 trials of 20 s "
        "first (--full: 20 trials of 75 s). --resume continues the victim's training and the study (an interrupted trial "
        "runs again)")

COMPONENTS = ("score", "explained", "plausible", "distinct", "non_degenerate", "in_range", "margin_consistent")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study-dir", default=None, help="an 'exhume tune' output folder (its tune.db and trials/)")
    p.add_argument("--storage", default=None, help="the study's storage URL if not STUDY_DIR/tune.db")
    p.add_argument("--study-name", default=f"exhume-{DEFAULT_METHOD}", help=f"study name in the storage (default exhume-{DEFAULT_METHOD})")
    p.add_argument("--against", default=None, help="victim folder (default: the one recorded in the study)")
    p.add_argument("--pool-size", type=int, default=1000, help="unseen images for the memorisation count (default 1000)")
    p.add_argument("--resume", action="store_true", help="without --study-dir: reuse the victim in --out (or continue its "
                   "training) and continue its study")
    p.add_argument("--trials", type=int, default=None, help="without --study-dir: trials to tune (default 8; --full 20)")
    p.add_argument("--trial-seconds", type=float, default=None, help="without --study-dir: seconds per trial (default 20; --full 75)")


def _spearman(a: list[float], b: list[float]) -> float | None:
    from scipy.stats import spearmanr

    a_, b_ = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a_) & np.isfinite(b_)
    if ok.sum() < 3 or np.ptp(a_[ok]) == 0 or np.ptp(b_[ok]) == 0:
        return None
    r = float(spearmanr(a_[ok], b_[ok]).statistic)
    return r if math.isfinite(r) else None


def judge(study, victim, pool_size: int = 1000, progress: bool = True, study_dir: str | Path | None = None) -> dict[str, Any]:
    """Oracle counts for every completed trial whose reconstruction is on this disk, and the correlations."""
    import optuna
    from tqdm.auto import tqdm

    import exhume
    from exhume.evaluation.run import evaluate
    from exhume.tune.study import trial_folder

    def folder(t) -> Path | None:  # with study_dir, only trial folders inside it are read
        return trial_folder(t, study_dir) if study_dir is not None else (Path(t.user_attrs["folder"]) if t.user_attrs.get("folder") else None)

    trials = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
              if folder(t) is not None and (folder(t) / "reconstruction.json").is_file()]
    if len(trials) < 2:
        raise ConfigError(f"the study has {len(trials)} completed trials with a reconstruction on this machine; need at least 2")
    rows = []
    for t in tqdm(trials, desc="oracle evaluation", disable=not progress):
        recon = exhume.load_reconstruction(folder(t))
        m = evaluate(recon, victim, pool_size=pool_size, figures=False).metrics
        rows.append({"trial": t.number, "default": bool(t.user_attrs.get("is_default")), "params": t.params,
                     **{c: t.user_attrs.get(c, t.value if c == "score" else None) for c in COMPONENTS},
                     "relative_stationarity": t.user_attrs.get("relative_stationarity"),
                     "iterations": t.user_attrs.get("iterations"),
                     "oracle_one_to_one_ssim>=0.4": m["one_to_one_ssim>=0.4"], "oracle_memorised": m["memorised"],
                     "oracle_ssim>=0.4": m["ssim>=0.4"]})
    corr: dict[str, dict[str, float | None]] = {}
    for c in (*COMPONENTS, "relative_stationarity"):
        vals = [(-r[c] if c == "relative_stationarity" else r[c]) if r[c] is not None else float("nan") for r in rows]
        key = "minus_relative_stationarity" if c == "relative_stationarity" else c
        corr[key] = {f"vs_oracle_{o}": _spearman(vals, [r[f"oracle_{o}"] for r in rows])
                     for o in ("one_to_one_ssim>=0.4", "memorised")}
    sel = max(rows, key=lambda r: r["score"])
    best_mem = max(rows, key=lambda r: r["oracle_memorised"])
    best_oto = max(rows, key=lambda r: r["oracle_one_to_one_ssim>=0.4"])
    default = next((r for r in rows if r["default"]), None)
    keep = ("trial", "score", "oracle_memorised", "oracle_one_to_one_ssim>=0.4", "params")
    return {
        "n_trials_judged": len(rows),
        "spearman_attacker_score_vs_oracle": corr["score"],
        "spearman_components_vs_oracle": corr,
        "attacker_selected": {k: sel[k] for k in keep},
        "oracle_best_by_memorised": {k: best_mem[k] for k in keep},
        "oracle_best_by_one_to_one_ssim>=0.4": {k: best_oto[k] for k in keep},
        "default_settings_trial": None if default is None else {k: default[k] for k in keep},
        "note": "oracle_* counts use the training set and are only for judging the selection; the tuner never saw them",
        "trials": rows,
    }


def _plot(rows: list[dict], path: Path) -> None:
    from exhume.evaluation.plots import subplots

    fig, axes = subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in zip(axes, ("oracle_memorised", "oracle_one_to_one_ssim>=0.4"), ("memorised (oracle)", "SSIM ≥ 0.4 one-to-one (oracle)")):
        ax.scatter([r["score"] for r in rows], [r[key] for r in rows], s=18)
        for r in rows:
            if r["default"]:
                ax.annotate("default", (r["score"], r[key]), fontsize=8)
        ax.set_xlabel("attacker-side score")
        ax.set_ylabel(label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@register_experiment("selection", HELP, add_arguments)
def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import exhume
    from exhume.tune import load_study, tune

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.study_dir is None and args.storage is None:
        from exhume.demo import DEMO_DATA, DEMO_TRAIN
        from exhume.victim import TrainConfig, make_victim

        victim_dir = out / "victim"
        if args.resume and (victim_dir / "victim.json").is_file():
            victim = exhume.load_victim(victim_dir)
        else:
            shutil.rmtree(out / "tune", ignore_errors=True)  # the study of the victim replaced (--force)
            cfg = TrainConfig(**{**DEMO_TRAIN, "max_seconds": DEMO_TRAIN["max_seconds"] if args.full else 30.0})
            victim = make_victim(DEMO_DATA["data"], DEMO_DATA["task"], DEMO_DATA["n"], DEMO_DATA["arch"], cfg, seed=args.seed,
                                 progress=progress, checkpoint=out / "victim-training.pt", resume=args.resume)
            victim.save(victim_dir)
        trials = args.trials or (20 if args.full else 8)
        seconds = args.trial_seconds or (75.0 if args.full else 20.0)
        tune(victim.attacker_view(), trials, out / "tune", trial_seconds=seconds, seed=args.seed, device=args.device,
             progress=progress, victim_path=str(victim_dir.resolve()), study_name=args.study_name)
        study_dir = out / "tune"
    else:
        study_dir = Path(args.study_dir) if args.study_dir else out
    study = load_study(args.storage, study_dir, args.study_name)
    against = args.against or study.user_attrs.get("victim")
    if not against:
        raise ConfigError("the study does not record its victim; pass --against VICTIM")
    victim = exhume.load_victim(against)
    result = judge(study, victim, pool_size=args.pool_size, progress=progress,
                   study_dir=study_dir if args.storage is None or args.study_dir else None)
    result["study"] = {"folder": str(study_dir), "name": args.study_name, "trial_seconds": study.user_attrs.get("trial_seconds"),
                       "victim": str(against)}
    (out / "selection.json").write_text(json.dumps(result, indent=2))
    _plot(result["trials"], out / "score_vs_oracle.png")
    return {k: v for k, v in result.items() if k != "trials"}
