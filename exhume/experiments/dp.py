"""``exhume experiment dp``: what differential privacy buys against reconstruction from the weights.

Two settings, n = 100 bundled MNIST digits (odd against even), each victim trained at every privacy
level with the same seed: ε = ∞ (ordinary training), clipping alone (Opacus with noise 0, the same
clipping norm: clipping's own effect apart from the noise's) and DP-SGD at each target ε
(:mod:`exhume.victim.private`, δ = 1e-5, Opacus's RDP accountant):

- ``paper``: the demo's victim (:mod:`exhume.victim.recipe`: bias-free MLP 784-256-256-1, full-batch
  gradient descent lr 0.2, weight decay 5e-3, 6,000 epochs; DP with sampling rate 1), attacked from
  the weights alone (kkt, the papers' threat model);
- ``minibatch``: an ordinary MLP 784-256-128-1 (PyTorch's initialisation, biases), SGD with
  momentum 0.9, lr 0.01, weight decay 5e-4, expected batch 25 (rate 0.25), 100 epochs, attacked
  with its start and training settings known (kkt, the known-start equation).

Each victim is attacked by one kkt run of fixed iterations and judged by ``exhume.evaluate``
against its training set (memorised, control, one-to-one SSIM, the verdict), with the membership
exposure from the weights beside it. Beside the measurement: the reconstruction bounds of
:mod:`exhume.victim.rero` at the victim's recorded (σ, q, T), κ the control's match rate pooled
over the setting's victims (the upper end of its 95 % interval). The bounds hold for an informed
adversary (every other record known); the measured fraction is one attack's lower bound on risk.

Writes ``dp.csv``, ``dp.md`` and ``dp.json`` (one row per victim), ``dp.png`` (memorised fraction
against ε, log x, the non-private and clipping-only values as lines, the bound beside) and
``dp-curve.json`` (the audit's measured reading: ``exhume/audit/dp_measured.json`` is the CPU
default's). Finished cells are reused with ``--resume`` (``cells/<key>/row.json``), a saved victim
is reused and an attack continues from its checkpoint; ``--chunk-seconds`` stops a chunk
checkpointed (a private victim cut in its training is trained again: Opacus's state is not kept).
"""

from __future__ import annotations

import argparse
import datetime
import math
import time
from pathlib import Path
from typing import Any

from exhume.attacks import DEFAULT_METHOD
from exhume.errors import ConfigError
from exhume.experiments.registry import command_line, positive_numbers, register_experiment, seed_list, write_csv
from exhume.files.jsonio import read_json, write_json
from exhume.victim.recipe import PAPER_ARCH, PAPER_TRAIN

#: the attack measured (one run, or --restarts pooled): the default attack, the one an audit runs
METHOD = DEFAULT_METHOD
#: the two settings: the victim, its training and how it is attacked
SETTINGS: dict[str, dict[str, Any]] = {
    "paper": {"arch": PAPER_ARCH, "trainer": "full-batch", "train": {"loss": "logistic", **PAPER_TRAIN, "max_epochs": 6000},
              "start_known": False, "what": "the demo's victim, full-batch GD, weights only"},
    "minibatch": {"arch": "mlp:256,128;bias=all", "trainer": "mini-batch",
                  "train": {"loss": "logistic", "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
                            "batch_size": 25, "epochs": 100},
                  "start_known": True, "what": "mini-batch SGD MLP, start known"},
}
DEFAULTS = {"settings": ["paper", "minibatch"], "epsilons": [10000.0, 1000.0, 100.0, 10.0, 1.0], "noise_multipliers": [],
            "clip_only": True, "seeds": [0],
            "iterations": 3000, "max_grad_norm": 0.1, "delta": 1e-5, "n": 100, "restarts": 1}
FULL = {**DEFAULTS, "epsilons": [10000.0, 1000.0, 300.0, 100.0, 30.0, 10.0, 3.0, 1.0], "noise_multipliers": [0.003, 0.01, 0.03, 0.1],
        "seeds": [0, 1, 2], "iterations": 20000, "restarts": 4}
#: the levels a victim is trained at besides the target epsilons (and the prefix of a level given by its noise multiplier)
NON_PRIVATE, CLIP_ONLY, SIGMA = "none", "clip", "sigma"
HELP = ("memorised fraction and membership exposure against the DP-SGD budget ε (Opacus), for the demo's victim (full-batch "
        "GD, weights only) and a mini-batch SGD MLP (start known), n = 100 MNIST, with clipping alone as a row and the "
        "reconstruction bounds of Balle et al. and Hayes et al. beside it. CPU default: ε = ∞, clipping only, 10000, 1000, "
        "100, 10, 1, one seed, one kkt run of 3,000 iterations per victim, clipping norm 0.1 (14 victims; needs "
        "pip install \"exhume[dp]\"). --full: eight ε from 10,000 to 1 and the noise multipliers 0.003-0.1 "
        "(ε up to about 10^8), three seeds, 4 restarts of 20,000 iterations (84 victims, for a GPU). Finished cells are "
        "reused with --resume.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", default=None, help="comma-separated: paper, minibatch (default both)")
    p.add_argument("--epsilons", default=None, help="target ε values, comma-separated (default 10000,1000,100,10,1)")
    p.add_argument("--noise-multipliers", default=None, help="more private levels given by their noise multiplier σ, "
                   "comma-separated (their ε is the accountant's: beyond the targets, e.g. 0.01,0.1)")
    p.add_argument("--no-clip-only", action="store_true", help="leave out the clipping-only row")
    p.add_argument("--seeds", default=None, help="victim and attack seeds, comma-separated (default: --seed)")
    p.add_argument("--iterations", type=int, default=None, help="kkt iterations per restart (default 3000; --full 20000)")
    p.add_argument("--restarts", type=int, default=None, help="kkt restarts per victim (default 1; --full 4)")
    p.add_argument("--max-grad-norm", type=float, default=None, help="DP-SGD's per-sample clipping norm (default 0.1)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs of every victim (default: each setting's)")
    p.add_argument("-n", type=int, default=None, help="training images per victim (default 100)")
    p.add_argument("--resume", action="store_true", help="reuse the finished cells in --out and continue the one in progress")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the CPU default or ``--full``, with the flags given on top (checked)."""
    s = {k: list(v) if isinstance(v, list) else v for k, v in (FULL if args.full else DEFAULTS).items()}
    s["seeds"] = s["seeds"] if args.full else [args.seed]
    if getattr(args, "seeds", None) is not None:
        s["seeds"] = seed_list(args.seeds)
    if getattr(args, "epsilons", None) is not None:
        s["epsilons"] = sorted(positive_numbers(args.epsilons, float, "epsilons"), reverse=True)
    if getattr(args, "noise_multipliers", None) is not None:
        s["noise_multipliers"] = sorted(positive_numbers(args.noise_multipliers, float, "noise-multipliers"))
    if getattr(args, "settings", None) is not None:
        s["settings"] = [v.strip() for v in args.settings.split(",") if v.strip()]
    if not s["settings"] or any(v not in SETTINGS for v in s["settings"]):
        raise ConfigError(f"--settings must list some of {', '.join(SETTINGS)}, got {args.settings!r}")
    for key in ("iterations", "restarts", "max_grad_norm", "epochs", "n"):
        if getattr(args, key, None) is not None:
            if not getattr(args, key) > 0:
                raise ConfigError(f"--{key.replace('_', '-')} must be > 0, got {getattr(args, key)}")
            s[key] = getattr(args, key)
    s["clip_only"] = not getattr(args, "no_clip_only", False)
    s["scale"] = "full" if args.full else "cpu-default"
    return s


#: the flags that reproduce a run (:func:`~exhume.experiments.registry.command_line`)
FLAGS = ("settings", "epsilons", "noise_multipliers", "seeds", "iterations", "restarts", "max_grad_norm", "epochs", "n")


def levels(s: dict[str, Any]) -> list[str]:
    """The privacy levels of every setting: ε = ∞, clipping only, the noise multipliers given (``sigma0.01``), then the
    target ε from the largest."""
    return [NON_PRIVATE, *([CLIP_ONLY] if s["clip_only"] else []), *(f"{SIGMA}{v:g}" for v in s.get("noise_multipliers", [])),
            *(f"{e:g}" for e in s["epsilons"])]


def _train_configs(setting: str, s: dict[str, Any], level: str):
    """``(train config, DPConfig or None)`` of ``setting`` at privacy ``level``."""
    from exhume.victim import MiniBatchConfig, TrainConfig
    from exhume.victim.private import DPConfig

    given = dict(SETTINGS[setting]["train"])
    if s.get("epochs"):
        given["max_epochs" if SETTINGS[setting]["trainer"] == "full-batch" else "epochs"] = int(s["epochs"])
    train = TrainConfig(**given) if SETTINGS[setting]["trainer"] == "full-batch" else MiniBatchConfig(**given)
    if level == NON_PRIVATE:
        return train, None
    if level == CLIP_ONLY:
        return train, DPConfig(noise_multiplier=0.0, max_grad_norm=s["max_grad_norm"], delta=s["delta"])
    if level.startswith(SIGMA):
        return train, DPConfig(noise_multiplier=float(level[len(SIGMA):]), max_grad_norm=s["max_grad_norm"], delta=s["delta"])
    return train, DPConfig(epsilon=float(level), max_grad_norm=s["max_grad_norm"], delta=s["delta"])


def victim_of(setting: str, level: str, seed: int, s: dict[str, Any], folder: Path, resume: bool, progress: bool):
    """The victim of one cell: trained (and saved in ``folder``), or read back from it with ``resume``."""
    from exhume.victim import load_victim, make_victim

    if resume and (folder / "victim.json").is_file():
        return load_victim(folder)
    train, private = _train_configs(setting, s, level)
    victim = make_victim("mnist", "odd-even", s["n"], SETTINGS[setting]["arch"], train, seed=seed, progress=progress,
                         private=private, keep_start=True)
    victim.save(folder)
    return victim


def known_training(victim) -> dict[str, Any]:
    """The training settings an owner who kept the start knows (the known-start attack's ``training``)."""
    cfg, dp = victim.train_config, victim.privacy
    steps = dp["steps"] if dp else cfg["epochs"] * math.ceil(len(victim.train_indices) / cfg["batch_size"])
    return {"optimizer": "sgd", "lr": cfg["lr"], "momentum": cfg["momentum"], "weight_decay": cfg["weight_decay"], "steps": int(steps)}


def attack_cell(victim, setting: str, seed: int, s: dict[str, Any], folder: Path, resume: bool, device: str, progress: bool):
    """One kkt attack of the cell's victim (checkpointed in ``folder``): weights only, or with its start and settings."""
    import exhume

    again = resume and ((folder / "checkpoint.pt").is_file() or (folder / "restarts").is_dir())
    threat = {"start": victim.start, "training": known_training(victim)} if SETTINGS[setting]["start_known"] else {}
    return exhume.attack(victim, METHOD, seed=seed, restarts=s["restarts"], iterations=s["iterations"], out=folder, resume=again,
                         force=not again, device=device, progress=progress, **threat)


def exposure(victim, seed: int) -> dict[str, Any]:
    """The membership exposure from the weights: the training images against ten unseen ones each, at most 1,000
    (AUC, TPR at 1 % FPR)."""
    import numpy as np

    from exhume.data import load_dataset
    from exhume.data.tasks import select_pool
    from exhume.evaluation.weights_membership import membership_exposure

    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    pool = select_pool(ds, train.spec["task"], min(1000, 10 * len(train)), exclude=np.asarray(train.indices), seed=seed + 2)
    record, _ = membership_exposure(victim.attacker_view(), train.centred, train.y, pool.x - victim.mean, pool.y, seed=seed)
    score = record["scores"][record["primary"]]
    return {"membership_auc": round(score["auc"]["value"], 4), "membership_tpr_at_1pct_fpr": round(score["tpr_at_0.01_fpr"]["value"], 4)}


def run_cell(setting: str, level: str, seed: int, s: dict, out: Path, resume: bool, device: str, progress: bool) -> dict:
    """Train, attack and judge one (setting, privacy level, seed); the row is saved in ``cells/<key>/row.json``."""
    import exhume

    key = f"{setting}_{level}_s{seed}"
    folder = out / "cells" / key
    if resume and (folder / "row.json").is_file():
        return read_json(folder / "row.json", what="a row written by exhume experiment dp")
    t0 = time.perf_counter()
    victim = victim_of(setting, level, seed, s, folder / "victim", resume, progress)
    trained = time.perf_counter()
    recon = attack_cell(victim, setting, seed, s, folder / "attack", resume, device, progress)
    attacked = time.perf_counter()
    m = exhume.evaluate(recon, victim, figures=False).metrics
    dp, vm = victim.privacy or {}, victim.metrics
    row = {"setting": setting, "level": level, "seed": seed, "epsilon": dp.get("epsilon") if dp else None,
           "epsilon_spent": dp.get("epsilon_spent") if dp else None, "noise_multiplier": dp.get("noise_multiplier", 0.0),
           "max_grad_norm": dp.get("max_grad_norm"), "sample_rate": dp.get("sample_rate"), "steps": dp.get("steps"),
           "train_accuracy": round(vm["train_accuracy"], 4), "test_accuracy": round(vm.get("test_accuracy", math.nan), 4),
           "memorised": m["memorised"], "control": m["memorised_control"], "control_size": m["control_size"], "n": s["n"],
           "one_to_one_ssim_mean": round(m["one_to_one_ssim_mean"], 4), "verdict": m["verdict"], "p_value": m.get("p_value"),
           **exposure(victim, seed), "iterations": recon.record.iterations, "train_seconds": round(trained - t0, 1),
           "attack_seconds": round(attacked - trained, 1)}
    write_json(folder / "row.json", row)
    if progress:
        print(f"  {setting:9s} {level:>6s} seed {seed}: memorised {row['memorised']}/{s['n']} (control {row['control']}), "
              f"1-1 SSIM {row['one_to_one_ssim_mean']:.2f}, membership AUC {row['membership_auc']:.2f}, test acc "
              f"{row['test_accuracy']:.2f}, {row['train_seconds'] + row['attack_seconds']:.0f} s", flush=True)
    return row


def with_bounds(rows: list[dict]) -> list[dict]:
    """Each row with κ (its setting's control pooled over every victim) and the bounds at its recorded (σ, q, T)."""
    from exhume.victim.rero import hayes_bound, kappa_from_control, rdp_bound

    kappas = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        group = [r for r in rows if r["setting"] == setting]
        kappas[setting] = kappa_from_control(sum(r["control"] for r in group), sum(r["control_size"] for r in group))
    out = []
    for r in rows:
        kappa, private = kappas[r["setting"]], (r["noise_multiplier"] or 0) > 0
        hayes = hayes_bound(r["noise_multiplier"], r["sample_rate"], r["steps"], kappa) if private else 1.0
        rdp = rdp_bound(r["noise_multiplier"], r["sample_rate"], r["steps"], kappa) if private else 1.0
        out.append({**r, "kappa": round(kappa, 5), "bound_hayes_2023": round(hayes, 4), "bound_balle_2022_rdp": round(rdp, 4)})
    return out


def curve(rows: list[dict]) -> list[dict]:
    """The rows pooled over seeds: one point per (setting, level), the fractions of every training image."""
    points = {}
    for r in rows:
        points.setdefault((r["setting"], r["level"]), []).append(r)
    out = []
    for (setting, level), group in points.items():
        total = sum(r["n"] for r in group)
        spent = [r["epsilon_spent"] for r in group if r.get("epsilon_spent") is not None]
        out.append({"setting": setting, "level": level, "epsilon": sum(spent) / len(spent) if spent else None, "runs": len(group),
                    "training_samples": total, "memorised": sum(r["memorised"] for r in group),
                    "control": sum(r["control"] for r in group), "fraction": round(sum(r["memorised"] for r in group) / total, 4),
                    "control_fraction": round(sum(r["control"] for r in group) / sum(r["control_size"] for r in group), 4),
                    **{k: _mean(group, k) for k in ("one_to_one_ssim_mean", "membership_auc", "test_accuracy", "bound_hayes_2023",
                                                    "bound_balle_2022_rdp", "kappa", "noise_multiplier")},
                    "leaks": sum(r["verdict"] == "leaks" for r in group)})
    return out


def _mean(group: list[dict], key: str) -> float:
    return round(sum(r[key] for r in group) / len(group), 4)


def eps_text(epsilon: float) -> str:
    """An ε as the table writes it: 1.2e+07, 10,000, 1,000, 9.99, 1."""
    return f"{epsilon:.2g}" if epsilon >= 1e5 else f"{epsilon:,.0f}" if epsilon >= 10 else f"{epsilon:.3g}"


def _label(level: str, spent: float | None = None) -> str:
    """A level in words: ∞, clipping only, a target ε, or a noise multiplier with the ε the accountant spent."""
    if level.startswith(SIGMA):
        return f"{eps_text(spent)} (σ = {level[len(SIGMA):]})"
    named = {NON_PRIVATE: "∞ (not private)", CLIP_ONLY: "clipping only (∞)"}
    return named[level] if level in named else eps_text(float(level))


def table(points: list[dict]) -> str:
    """The markdown table of the pooled points."""
    head = ("| setting | ε | σ | test acc | memorised / n | control | one-to-one SSIM | membership AUC | leaks (runs) "
            "| bound: Hayes et al. | bound: Balle et al. (RDP) |")
    lines = [head, "|" + "---|" * 11]
    for p in points:
        lines.append(f"| {p['setting']} | {_label(p['level'], p['epsilon'])} | {p['noise_multiplier']:.3g} | {p['test_accuracy']:.3f} | "
                     f"{p['memorised']} / {p['training_samples']} | {p['control']} | {p['one_to_one_ssim_mean']:.3f} | "
                     f"{p['membership_auc']:.3f} | {p['leaks']} ({p['runs']}) | {p['bound_hayes_2023']:.3g} | "
                     f"{p['bound_balle_2022_rdp']:.3g} |")
    return "\n".join(lines)


def figure(points: list[dict], path: Path) -> None:
    """Memorised fraction against ε (log x), one panel per setting: the non-private and clipping-only values as
    horizontal lines, Hayes et al.'s bound beside the measurement."""
    from exhume.evaluation.plots import subplots

    settings = list(dict.fromkeys(p["setting"] for p in points))
    fig, axes = subplots(1, len(settings), figsize=(5.0 * len(settings), 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        pts = [p for p in points if p["setting"] == setting]
        private = sorted((p for p in pts if p["level"] not in (NON_PRIVATE, CLIP_ONLY)), key=lambda p: p["epsilon"])
        eps = [p["epsilon"] for p in private]
        ax.plot(eps, [p["fraction"] for p in private], "o-", label="memorised (measured, kkt)")
        ax.plot(eps, [p["control_fraction"] for p in private], "x:", color="grey", label="control")
        ax.plot(eps, [p["bound_hayes_2023"] for p in private], "s--", color="C3", label="bound (Hayes et al. 2023), κ = control")
        for level, style, color in ((NON_PRIVATE, "-", "k"), (CLIP_ONLY, "-.", "C2")):
            for p in (p for p in pts if p["level"] == level):
                ax.axhline(p["fraction"], ls=style, color=color, lw=1, label=f"{_label(level)}: {p['fraction']:.2f}")
        ax.set(xscale="log", xlabel="ε (δ = 1e-5)", ylabel="fraction of training images", ylim=(-0.03, 1.03),
               title=f"{setting}: {SETTINGS[setting]['what']}")
        ax.legend(fontsize=6.5, loc="center right", bbox_to_anchor=(1.0, 0.66))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _write(rows: list[dict], points: list[dict], s: dict, out: Path, command: str, seconds: float) -> dict[str, Any]:
    write_csv(out / "dp.csv", rows)
    (out / "dp.md").write_text(table(points) + "\n")
    figure(points, out / "dp.png")
    measured_on = (f"bundled MNIST odd/even, n = {s['n']}, seed(s) {', '.join(map(str, s['seeds']))}; {s['restarts']} kkt "
                   f"run(s) of {s['iterations']} iterations per victim, clipping norm {s['max_grad_norm']:g}, δ = {s['delta']:g}")
    write_json(out / "dp-curve.json", {"what": "memorised fraction of the training images against the DP-SGD target ε, pooled "
                                       "over seeds", "method": METHOD, "settings": {k: SETTINGS[k] for k in s["settings"]},
                                       "measured_on": measured_on, "date": datetime.date.today().isoformat(), "command": command,
                                       "run_settings": s, "points": points})
    summary = {"experiment": "dp", "settings": s, "command": command, "seconds": round(seconds, 1), "points": points,
               "table": table(points), "files": {k: str(out / v) for k, v in (("table_csv", "dp.csv"), ("table_md", "dp.md"),
                                                                                 ("table_json", "dp.json"), ("figure", "dp.png"),
                                                                                 ("curve", "dp-curve.json"))}}
    write_json(out / "dp.json", {**summary, "rows": rows})
    return summary


def threshold_line(points: list[dict]) -> str:
    """Per setting: the non-private and clipping-only fractions, the smallest ε with a leak, and the ε at and below
    which nothing was memorised."""
    parts = []
    for setting in dict.fromkeys(p["setting"] for p in points):
        pts = [p for p in points if p["setting"] == setting]
        private = sorted((p for p in pts if p["level"] not in (NON_PRIVATE, CLIP_ONLY)), key=lambda p: p["epsilon"])
        plain = [f"{_label(p['level'])} {p['fraction']:.2f}" for p in pts if p["level"] in (NON_PRIVATE, CLIP_ONLY)]
        leaking = [p for p in private if p["leaks"]]
        clean = [p["epsilon"] for i, p in enumerate(private) if all(q["memorised"] == 0 for q in private[:i + 1])]
        parts.append(f"{setting}: " + ", ".join(plain)
                     + (f"; smallest ε with a leak {eps_text(leaking[0]['epsilon'])} ({leaking[0]['fraction']:.2f})" if leaking
                        else "; no leak at any ε measured")
                     + (f"; nothing memorised at ε ≤ {eps_text(clean[-1])}" if clean else ""))
    return "; ".join(parts)


@register_experiment("dp", HELP, add_arguments)
def run(args: argparse.Namespace) -> dict[str, Any]:
    from exhume.victim.private import require_opacus

    s = settings(args)
    require_opacus()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, progress, rows = time.perf_counter(), not args.no_progress, []
    for setting in s["settings"]:
        for seed in s["seeds"]:
            for level in levels(s):
                rows.append(run_cell(setting, level, seed, s, out, args.resume, getattr(args, "device", "cpu"), progress))
    rows = with_bounds(rows)
    points = curve(rows)
    command = command_line("dp", args, FLAGS, ["--no-clip-only"] if getattr(args, "no_clip_only", False) else [])
    result = _write(rows, points, s, out, command, time.perf_counter() - t0)
    result["paper_finding"] = ("DP-SGD bounds what an informed adversary reconstructs (Balle et al. 2022; Hayes et al. 2023): "
                               "success at most the bound, which tends to the prior's κ as ε falls")
    result["this_run"] = threshold_line(points)
    return result
