"""``exhume experiment law``: what the known-start attack recovers against ``p/(d·n)`` (Iurada et al., ICLR 2026).

For every family (:mod:`exhume.victim.law`), training-set size ``n``, ratio ``p/(d·n)`` and seed, a
victim is built at the width whose trained parameters ``p`` reach ``ratio·d·n``, trained from
PyTorch's initialisation by full-batch gradient descent (logistic loss, the digits 0 against 1),
and attacked with its start known by kkt (one run, ``start_equation="auto"``) with learned and with
closed-form multipliers at equal iterations. Each run is judged by ``exhume.evaluate`` against the
``n`` training images, every other 0 and 1 of the dataset being pool and control: the memorised count
(against the control), the one-to-one SSIM, and the same with ``candidate_scale="minmax"``.

Writes ``law.csv`` and ``law.json`` (one row per run), ``law.png`` (memorised fraction against
``p/(d·n)``, log x, one line per family and formulation) and ``law-curve.json``: the curve pooled
over ``n`` and seeds with its settings, date and command, the file the audit reads its measured
reading from (``exhume/audit/law_measured.json`` is the CPU default's). Runs are checkpointed:
``--resume`` reuses finished rows and continues an attack in progress, ``--chunk-seconds`` stops
a chunk checkpointed.
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path
from typing import Any

import torch

from exhume.errors import ConfigError
from exhume.experiments.registry import command_line, positive_numbers, register_experiment, seed_list, write_csv
from exhume.files.jsonio import read_json, write_json

#: the attack measured (one run, the start known)
METHOD = "kkt"
#: the two formulations, side by side at equal iterations (closed-form at the candidates' rate measured for it)
VARIANTS = {"learned": {}, "closed-form": {"multipliers": "closed-form", "lr": 3e-2}}
DEFAULTS = {"data": "digits", "families": ["random-features", "two-layer-mlp"], "ratios": [0.25, 1.0, 4.0, 16.0],
            "ns": [5, 10], "seeds": [0], "iterations": 1000, "victim_steps": 500, "variants": list(VARIANTS)}
FULL = {"data": "mnist", "families": ["random-features", "two-layer-mlp", "cnn"],
        "ratios": [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0], "ns": [5, 10, 20, 50], "seeds": [0, 1], "iterations": 3000,
        "victim_steps": 1000, "variants": list(VARIANTS)}
#: each family's training rate (full-batch gradient descent on the logistic loss)
TRAIN_LR = {"random-features": 0.5, "two-layer-mlp": 0.5, "cnn": 0.1}
HELP = ("memorised fraction and one-to-one SSIM against p/(d·n) (the law of data reconstruction, Iurada et al.), "
        "the start known, learned and closed-form multipliers at equal iterations. CPU default: sklearn's 8x8 digits "
        "(d = 64) 0 against 1, random features and two-layer MLPs trained by full-batch GD from PyTorch's init, n = 5 and 10, "
        "p/(d·n) = 0.25, 1, 4, 16, one seed, 1,000 kkt iterations per run (16 victims, 32 runs). --full: bundled MNIST "
        "(d = 784), also a small CNN, n = 5, 10, 20, 50, seven ratios 0.25-16, two seeds, 3,000 iterations (for a GPU: "
        "docs/defaults.md gives its expected wall time). Finished runs are reused with --resume.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", default=None, help="comma-separated: random-features, two-layer-mlp, cnn")
    p.add_argument("--ratios", default=None, help="p/(d·n) values, comma-separated (default 0.25,1,4,16)")
    p.add_argument("--ns", default=None, help="training-set sizes, comma-separated (default 5,10)")
    p.add_argument("--seeds", default=None, help="victim and attack seeds, comma-separated (default: --seed)")
    p.add_argument("--data", default=None, help="digits (8x8, needs scikit-learn) or mnist (the bundled digits)")
    p.add_argument("--iterations", type=int, default=None, help="kkt iterations per run (default 1000; --full 3000)")
    p.add_argument("--variants", default=None, help="the formulations, comma-separated: learned, closed-form (default both)")
    p.add_argument("--victim-steps", type=int, default=None, help="gradient-descent steps per victim (default 500)")
    p.add_argument("--resume", action="store_true", help="reuse the finished runs in --out and continue the one in progress")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the CPU default or ``--full``, with the flags given on top (checked)."""
    from exhume.victim.law import FAMILIES

    s = {k: list(v) if isinstance(v, list) else v for k, v in (FULL if args.full else DEFAULTS).items()}
    s["seeds"] = [args.seed] if not args.full else s["seeds"]
    for key, kind in (("ratios", float), ("ns", int)):
        if getattr(args, key, None) is not None:
            s[key] = positive_numbers(getattr(args, key), kind, key)
    if getattr(args, "seeds", None) is not None:
        s["seeds"] = seed_list(args.seeds)
    if getattr(args, "variants", None) is not None:
        s["variants"] = [v.strip() for v in args.variants.split(",") if v.strip()]
        if not s["variants"] or any(v not in VARIANTS for v in s["variants"]):
            raise ConfigError(f"--variants must list some of {', '.join(VARIANTS)}, got {args.variants!r}")
    if args.families is not None:
        s["families"] = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in s["families"] if f not in FAMILIES]
    if bad or not s["families"]:
        raise ConfigError(f"--families must list some of {', '.join(FAMILIES)}, got {args.families!r}")
    for key in ("data", "iterations", "victim_steps"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if s["data"] not in ("digits", "mnist"):
        raise ConfigError(f"--data must be digits or mnist, got {s['data']!r}")
    if s["iterations"] < 1 or s["victim_steps"] < 1:
        raise ConfigError("--iterations and --victim-steps must be >= 1")
    s["scale"] = "full" if args.full else "cpu-default"
    return s


#: the flags that reproduce a run (:func:`~exhume.experiments.registry.command_line`)
FLAGS = ("families", "ratios", "ns", "seeds", "data", "iterations", "victim_steps", "variants")


def dataset(name: str):
    """``(images, ±1 labels)``: the 0s and 1s of sklearn's 8×8 digits or of the bundled MNIST digits, in [0, 1], label +1 for 0."""
    from exhume.data import load_dataset

    ds = load_dataset(name)
    labels = torch.tensor(ds.labels)
    keep = labels <= 1
    return torch.tensor(ds.images, dtype=torch.float32)[keep], torch.where(labels[keep] == 0, 1.0, -1.0)


def victim(family: str, images, labels, n: int, ratio: float, seed: int, steps: int):
    """``(view, train, y, unseen, record)``: the victim at ``ratio`` trained on ``n`` images drawn by ``seed``."""
    from exhume.victim import AttackerView
    from exhume.victim.law import build, family_of, train_full_batch, trained_count, width_for

    shape = tuple(images.shape[1:])
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    train, y, unseen = images[order[:n]], labels[order[:n]], images[order[n:]]
    mean = images.mean(0)
    width = width_for(family, shape, n, ratio)
    torch.manual_seed(seed)
    model = build(family, shape, width)
    start = train_full_batch(model, train, y, mean, steps, TRAIN_LR[family])
    with torch.no_grad():
        margins = y * model(train - mean)
    d = train[0].numel()
    record = {"family": family_of(model, start), "width": width, "p": trained_count(model), "d": d,
              "p_over_dn": round(trained_count(model) / (d * n), 4), "train_accuracy": float((margins > 0).float().mean()),
              "min_margin": round(float(margins.min()), 3)}
    view = AttackerView(model=model, task="binary", input_shape=shape, mean=mean, start=start, loss="logistic", n_train_hint=n)
    return view, train, y, unseen, record


def run_one(view, train, y, unseen, variant: str, iterations: int, seed: int, folder: Path, resume: bool, device: str) -> dict:
    """One kkt run (checkpointed in ``folder``) judged with clipped and min–max-scaled candidates."""
    import exhume

    again = resume and (folder / "checkpoint.pt").is_file()
    t0 = time.perf_counter()
    recon = exhume.attack(view, METHOD, seed=seed, restarts=1, out=folder, resume=again, force=not again, progress=False,
                          device=device, iterations=iterations, **VARIANTS[variant])
    row = {"variant": variant, "iterations": recon.record.iterations, "seconds": round(time.perf_counter() - t0, 1),
           "residual": recon.record.final_relative_stationarity}
    for scale in ("clip", "minmax"):
        m = exhume.evaluate(recon, train=(train, y), unseen=unseen, figures=False, candidate_scale=scale).metrics
        tag = "" if scale == "clip" else "_minmax"
        row.update({f"memorised{tag}": m["memorised"], f"control{tag}": m["memorised_control"],
                    f"one_to_one_ssim_mean{tag}": round(m["one_to_one_ssim_mean"], 4)})
        if scale == "clip":
            row["verdict"] = m["verdict"]
    return row


def all_rows(s: dict, out: Path, resume: bool, device: str, progress: bool) -> list[dict]:
    """Every (family, n, ratio, seed, formulation) row, each saved as it finishes (``runs/<key>/row.json``)."""
    images, labels = dataset(s["data"])
    rows = []
    for family in s["families"]:
        for n in s["ns"]:
            for ratio in s["ratios"]:
                for seed in s["seeds"]:
                    rows += _case_rows(family, n, ratio, seed, images, labels, s, out, resume, device, progress)
    return rows


def _case_rows(family, n, ratio, seed, images, labels, s, out, resume, device, progress) -> list[dict]:
    keys = {v: out / "runs" / f"{family}_n{n}_r{ratio:g}_s{seed}_{v}" for v in s["variants"]}
    if resume and all((k / "row.json").is_file() for k in keys.values()):
        return [read_json(k / "row.json", what="a row written by exhume experiment law") for k in keys.values()]
    view, train, y, unseen, record = victim(family, images, labels, n, ratio, seed, s["victim_steps"])
    rows = []
    for variant, folder in keys.items():
        if resume and (folder / "row.json").is_file():
            rows.append(read_json(folder / "row.json", what="a row written by exhume experiment law"))
            continue
        row = {"family": family, "n": n, "ratio": ratio, "seed": seed, **record,
               **run_one(view, train, y, unseen, variant, s["iterations"], seed, folder, resume, device)}
        write_json(folder / "row.json", row)
        rows.append(row)
        if progress:
            print(f"  {family:15s} n={n:<3d} p/(d·n)={row['p_over_dn']:<7.3g} {variant:11s} memorised {row['memorised']}/{n} "
                  f"(control {row['control']}), 1-1 SSIM {row['one_to_one_ssim_mean']:.2f}, {row['iterations']} it, "
                  f"{row['seconds']:.0f} s", flush=True)
    return rows


def curve(rows: list[dict]) -> list[dict]:
    """The rows pooled over ``n`` and seeds: one point per (family, formulation, nominal ratio)."""
    points = {}
    for r in rows:
        points.setdefault((r["family"], r["variant"], r["ratio"]), []).append(r)
    out = []
    for (family, variant, ratio), group in sorted(points.items()):
        total = sum(r["n"] for r in group)
        out.append({"family": family, "variant": variant, "p_over_dn": ratio, "runs": len(group), "training_samples": total,
                    "memorised": sum(r["memorised"] for r in group), "control": sum(r["control"] for r in group),
                    "fraction": round(sum(r["memorised"] for r in group) / total, 4),
                    "one_to_one_ssim_mean": round(sum(r["one_to_one_ssim_mean"] * r["n"] for r in group) / total, 4),
                    "fraction_minmax": round(sum(r["memorised_minmax"] for r in group) / total, 4)})
    return out


def figure(points: list[dict], path: Path, title: str) -> None:
    """Memorised fraction against p/(d·n) (log x), one line per family and formulation."""
    from exhume.evaluation.plots import subplots

    fig, ax = subplots(figsize=(5.6, 3.6))
    for family in dict.fromkeys(p["family"] for p in points):
        for variant, style in zip(VARIANTS, ("o-", "s--")):
            pts = [p for p in points if p["family"] == family and p["variant"] == variant]
            if pts:
                ax.plot([p["p_over_dn"] for p in pts], [p["fraction"] for p in pts], style, label=f"{family}, {variant}")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="p/(d·n)", ylabel="memorised fraction", ylim=(-0.03, 1.03), title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _write(rows: list[dict], points: list[dict], s: dict, out: Path, command: str, seconds: float) -> dict[str, Any]:
    write_csv(out / "law.csv", rows)
    measured_on = (f"{'sklearn 8x8 digits' if s['data'] == 'digits' else 'bundled MNIST digits'} (0 against 1), "
                   f"n = {', '.join(map(str, s['ns']))}, seeds {', '.join(map(str, s['seeds']))}, "
                   f"{s['iterations']} kkt iterations per run (one run, the start known)")
    curve_file = {"what": "memorised fraction of the training samples against p/(d·n), pooled over n and seeds",
                  "method": METHOD, "task": "binary", "variants": {v: VARIANTS[v] for v in s["variants"]}, "measured_on": measured_on,
                  "date": datetime.date.today().isoformat(), "command": command,
                  "settings": s, "points": points}
    write_json(out / "law-curve.json", curve_file)
    figure(points, out / "law.png", f"the law, {s['data']} (d = {rows[0]['d']}), n = {', '.join(map(str, s['ns']))}")
    summary = {"experiment": "law", "settings": s, "command": command, "seconds": round(seconds, 1), "points": points,
               "files": {"table_csv": str(out / "law.csv"), "table_json": str(out / "law.json"),
                         "curve": str(out / "law-curve.json"), "figure": str(out / "law.png")}}
    write_json(out / "law.json", {**summary, "rows": rows})
    return summary


@register_experiment("law", HELP, add_arguments)
def run(args: argparse.Namespace) -> dict[str, Any]:
    s = settings(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = all_rows(s, out, args.resume, getattr(args, "device", "cpu"), not args.no_progress)
    points = curve(rows)
    result = _write(rows, points, s, out, command_line("law", args, FLAGS), time.perf_counter() - t0)
    above = [p for p in points if p["p_over_dn"] >= 4]
    below = [p for p in points if p["p_over_dn"] < 1]
    result["paper_finding"] = ("with the start known and p well above d·n, what training added determines every training "
                               "sample: entire training sets are recovered; below d·n other inputs explain it as well")
    result["this_run"] = (f"memorised fraction {_mean(above):.2f} at p/(d·n) >= 4 against {_mean(below):.2f} below 1 "
                          f"(both formulations, all families)")
    return result


def _mean(points: list[dict]) -> float:
    total = sum(p["training_samples"] for p in points)
    return sum(p["memorised"] for p in points) / total if total else float("nan")
