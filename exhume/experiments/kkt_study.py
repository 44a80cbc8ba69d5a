"""The KKT family's findings as experiments: margin, architecture, weight decay, multiclass, width vs n.

Every case trains a victim (full-batch GD, a fixed number of epochs), runs the ``kkt`` attack for
a fixed number of iterations (so results do not depend on machine load), and evaluates it
against the training set, a 1000-image unseen pool and a held-out control (docs/METHODS.md §4).
Defaults are sized for a CPU (each experiment's help states its cases, epochs and iterations);
``--full`` uses the papers' scale (n = 500, 1000-1000 MLPs, 50,000 iterations) and needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exhume.evaluation.plots import subplots
from exhume.experiments.registry import register_experiment, write_csv
from exhume.victim.recipe import PAPER_ARCH, PAPER_ARCH_FULL, PAPER_TRAIN


@dataclass(frozen=True)
class Case:
    label: str
    task: str = "odd-even"
    n: int = 100
    arch: str = PAPER_ARCH
    wd: float = PAPER_TRAIN["weight_decay"]
    lr: float = PAPER_TRAIN["lr"]
    epochs: int = 6000
    data: str = "mnist"
    attack: tuple[tuple[str, Any], ...] = ()  # extra kkt parameters, e.g. (("tv_weight", 1e-4),)


def run_case(case: Case, iterations: int, seed: int, out: Path, device: str, progress: bool,
             figures: bool = False, victim=None, resume: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    """Train (unless ``victim`` is given: one trained for an earlier case), attack, evaluate.
    Returns the table row, the per-image arrays and the victim.

    With ``resume``, a finished case (``case.json`` and ``arrays.npz`` in its folder) is read back
    instead of run, a saved victim is reused, a victim whose training was cut short continues from
    ``victim-training.pt``, and an attack continues from its checkpoint: a ``--full`` experiment
    runs in chunks (``--chunk-seconds``), each continuing where the last one stopped.
    """
    import exhume
    from exhume.data import DEFAULT_LOSS, task_kind
    from exhume.files.jsonio import read_json
    from exhume.victim import TrainConfig, load_victim, make_victim

    t0 = time.perf_counter()
    cfg = TrainConfig(loss=DEFAULT_LOSS[task_kind(case.task)], lr=case.lr, weight_decay=case.wd, max_epochs=case.epochs)
    folder = out / case.label.replace(" ", "_").replace("/", "-")
    if resume and (folder / "case.json").is_file() and (folder / "arrays.npz").is_file():
        done = read_json(folder / "case.json", what="a finished experiment case")
        with np.load(folder / "arrays.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        print(f"  finished in an earlier chunk: {folder / 'case.json'}")
        return done["row"], arrays, victim if victim is not None else load_victim(folder / done["victim"])
    if victim is not None:
        print(f"  reusing the victim trained for an earlier case: {victim.path}")
    elif resume and (folder / "victim" / "victim.json").is_file():
        victim = load_victim(folder / "victim")
        print(f"  reusing the victim trained in an earlier chunk: {victim.path}")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        victim = make_victim(case.data, case.task, case.n, case.arch, cfg, seed=seed, progress=progress, test_size=500,
                             checkpoint=folder / "victim-training.pt", resume=resume)
        victim.save(folder / "victim")  # sets victim.path: later chunks and cases that share the victim find it
    attack_dir = folder / "attack"
    if resume and (attack_dir / "reconstruction.json").is_file():
        recon = exhume.load_reconstruction(attack_dir)
    else:
        again = resume and (attack_dir / "checkpoint.pt").is_file()  # else an earlier run there is replaced (--force)
        recon = exhume.attack(victim, "kkt", seed=seed, restarts=1, out=attack_dir, device=device, progress=progress,
                              iterations=iterations, resume=again, force=not again, **dict(case.attack))
    result = exhume.evaluate(recon, victim, out=folder / "evaluation", figures=figures)
    row = _row(case, victim, recon, result.metrics, time.perf_counter() - t0)
    arrays = {"ssim": result.arrays["ssim"], "margin": result.arrays.get("margin"), "memorised": result.arrays.get("memorised")}
    _save_case(folder, row, arrays, victim)
    return row, arrays, victim


def _row(case: Case, victim, recon, m: dict[str, Any], seconds: float) -> dict[str, Any]:
    params = sum(p.numel() for p in victim.model.parameters())
    return {
        "case": case.label, "task": case.task, "n": case.n, "arch": case.arch, "weight_decay": case.wd,
        "epochs": victim.metrics["epochs"], "attack_params": json.dumps(dict(case.attack)),
        "parameters": params, "params_per_nd": params / (case.n * int(np.prod(victim.input_shape))),
        "train_accuracy": victim.metrics["train_accuracy"], "test_accuracy": victim.metrics.get("test_accuracy"),
        "victim_residual": victim.metrics.get("stationarity_residual"),
        "ssim>=0.4": m["ssim>=0.4"], "one_to_one_ssim>=0.4": m["one_to_one_ssim>=0.4"],
        "memorised": m["memorised"], "memorised_control": m.get("memorised_control"),
        "reconstructed_fraction": m["one_to_one_ssim>=0.4"] / case.n, "memorised_fraction": m["memorised"] / case.n,
        "margin_spearman_rho": m.get("margin_spearman_rho"), "attack_seconds": recon.record.seconds,
        "case_seconds": round(seconds, 1),
    }


def _save_case(folder: Path, row: dict[str, Any], arrays: dict[str, Any], victim) -> None:
    """``arrays.npz`` first, then ``case.json`` (atomic): a case counts as finished only when both are there."""
    import io

    from exhume.files.jsonio import atomic_write, write_json

    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items() if v is not None})
    atomic_write(folder / "arrays.npz", buffer.getvalue())
    write_json(folder / "case.json", {"row": row, "victim": os.path.relpath(victim.path, folder)})  # relative: the run folder may move


def finish(out: Path, name: str, rows: list[dict[str, Any]], paper_finding: str, this_run: str, agrees: bool | None,
           settings: dict[str, Any]) -> dict[str, Any]:
    write_csv(out / f"{name}.csv", rows, list(rows[0]))
    summary = {"experiment": name, "paper_finding": paper_finding, "this_run": this_run,
               "agrees_with_paper": agrees, "settings": settings, "rows": rows,
               "figure": str(out / f"{name}.png"), "table": str(out / f"{name}.csv")}
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\n{name}: paper found: {paper_finding}\n{name}: this run:   {this_run}  (agrees: {agrees})")
    return {k: summary[k] for k in ("experiment", "paper_finding", "this_run", "agrees_with_paper", "figure", "table")}


def _arguments(default_epochs: int = 6000):
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--iterations", type=int, default=None, help="attack iterations per case (default 4000; --full 50000)")
        p.add_argument("--epochs", type=int, default=None,
                       help=f"victim training epochs per case (default {default_epochs}; --full 100000)")
        p.add_argument("--resume", action="store_true", help="reuse the finished cases in --out and continue the victim "
                       "training and the attack in progress from their checkpoints")
    return add


_args = _arguments()


def _setup(args: argparse.Namespace, default_epochs: int = 6000) -> tuple[Path, int, int, bool]:
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    iterations = args.iterations or (50_000 if args.full else 4000)
    epochs = args.epochs or (100_000 if args.full else default_epochs)
    return out, iterations, epochs, not args.no_progress


def _run_all(cases: list[Case], args, epochs: int, iterations: int, out: Path, progress: bool, figures: bool = False):
    rows, arrays = [], []
    victims: dict[Case, Any] = {}  # cases that differ only in the attack share one victim
    for case in cases:
        case = replace(case, epochs=epochs)
        print(f"case {case.label}: {asdict(case)}")
        key = replace(case, label="", attack=())
        row, arr, victims[key] = run_case(case, iterations, args.seed, out, args.device, progress, figures=figures,
                                          victim=victims.get(key), resume=args.resume)
        print(f"  -> one-to-one SSIM>=0.4 {row['one_to_one_ssim>=0.4']}/{case.n}, memorised {row['memorised']} "
              f"(control {row['memorised_control']}), {row['case_seconds']} s")
        rows.append(row)
        arrays.append(arr)
    return rows, arrays


BUDGET = "CPU default: 6000 training epochs and 4000 kkt iterations per case; --full: the paper's scale"


@register_experiment("margin", f"SSIM of every training image against its margin for several n (Haim Fig. 4 top). {BUDGET}.", _args)
def margin_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args)
    ns = [250, 500, 1000] if args.full else [30, 100]
    arch = PAPER_ARCH_FULL if args.full else PAPER_ARCH
    rows, arrays = _run_all([Case(f"n={n}", n=n, arch=arch) for n in ns], args, epochs, iterations, out, progress)
    fig, axes = subplots(1, len(rows), figsize=(4 * len(rows), 3.4), squeeze=False)
    for ax, row, arr in zip(axes[0], rows, arrays):
        mem = arr["memorised"].astype(bool)
        ax.scatter(arr["margin"][~mem], arr["ssim"][~mem], s=10, label="not memorised")
        ax.scatter(arr["margin"][mem], arr["ssim"][mem], s=14, c="crimson", label="memorised")
        ax.axhline(0.4, ls="--", c="gray", lw=0.8)
        ax.set(title=f"{row['case']} (rho {row['margin_spearman_rho']:.2f})", xlabel="margin y·Φ(x)", ylabel="best SSIM")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "margin.png", dpi=110)
    rhos = [r["margin_spearman_rho"] for r in rows]
    fracs = [r["reconstructed_fraction"] for r in rows]
    agrees = all(r is not None and r < 0 for r in rhos) and fracs[0] >= fracs[-1]
    return finish(out, "margin", rows,
                  "samples near the margin (small y·Φ) are the ones reconstructed, and fewer samples are reconstructed as n grows",
                  f"Spearman rho(margin, SSIM) = {', '.join(f'{r:.2f}' for r in rhos)} for n = {ns}; "
                  f"reconstructed fraction {', '.join(f'{f:.2f}' for f in fracs)}",
                  agrees, {"iterations": iterations, "epochs": epochs, "arch": arch})


@register_experiment("architecture", f"Reconstruction across widths/depths, incl. a non-homogeneous MLP with biases (Haim Fig. 4 bottom). {BUDGET}.", _args)
def architecture_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args)
    n = 500 if args.full else 100
    archs = (["mlp:1000;init=1e-4", "mlp:1000,1000;init=1e-4", "mlp:1000,1000,1000;init=1e-4", "mlp:1000,1000;bias=all;init=1e-4"]
             if args.full else ["mlp:512;init=1e-4", "mlp:256,256;init=1e-4", "mlp:256,256,256;init=1e-4", "mlp:256,256;bias=all;init=1e-4"])
    cases = [Case(a.split(";init")[0], n=n, arch=a) for a in archs]
    rows, _ = _run_all(cases, args, epochs, iterations, out, progress)
    _bars(rows, out / "architecture.png", "architecture")
    nonhom = rows[-1]
    agrees = all(r["memorised"] > (r["memorised_control"] or 0) for r in rows)
    return finish(out, "architecture", rows,
                  "training samples are reconstructed from MLPs of several depths and widths, and also from a non-homogeneous MLP with biases",
                  "; ".join(f"{r['case']}: {r['one_to_one_ssim>=0.4']} one-to-one, {r['memorised']} memorised (control {r['memorised_control']})" for r in rows)
                  + f" — non-homogeneous: {nonhom['memorised']} memorised",
                  agrees, {"iterations": iterations, "epochs": epochs, "n": n})


@register_experiment("weight-decay", f"Reconstructed and memorised counts against weight decay at equal (100%) train accuracy (Buzaglo). {BUDGET}.", _args)
def weight_decay_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args)
    wds = [0.0, 1e-4, 1e-3, 5e-3, 2e-2] if args.full else [0.0, 1e-3, 5e-3, 2e-2]
    rows, _ = _run_all([Case(f"wd={w:g}", wd=w) for w in wds], args, epochs, iterations, out, progress)
    fig, ax = subplots(figsize=(5, 3.4))
    xs = np.arange(len(rows))
    ax.plot(xs, [r["one_to_one_ssim>=0.4"] for r in rows], "o-", label="SSIM>=0.4 (one-to-one)")
    ax.plot(xs, [r["memorised"] for r in rows], "s-", label="memorised")
    ax.plot(xs, [r["memorised_control"] for r in rows], "x:", label="memorised, held-out control")
    ax.set_xticks(xs, [r["case"] for r in rows])
    ax.set(ylabel="training images (of 100)", title="weight decay vs reconstructability")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "weight-decay.png", dpi=110)
    acc = [r["train_accuracy"] for r in rows]
    mem = [r["memorised"] for r in rows]
    agrees = mem[-1] > mem[0] or max(mem[1:]) > mem[0]
    return finish(out, "weight-decay", rows, "weight decay increases reconstructability",
                  f"memorised {mem} and one-to-one {[r['one_to_one_ssim>=0.4'] for r in rows]} for weight decay {wds} "
                  f"(train accuracy {acc})", agrees, {"iterations": iterations, "epochs": epochs})


MC_CLASSES = {2: "multiclass:0,1", 5: "multiclass:0,1,2,3,4", 10: "multiclass"}
MC_CLAIM = ("at a fixed number of training samples per class, a classifier trained on more classes leaks more: "
            "more of its training samples (also per class) are reconstructed (Buzaglo et al., multiclass section)")


def _per_class(row: dict[str, Any], arrays: dict[str, np.ndarray], victim) -> dict[str, Any]:
    """Memorised training images per class (the evaluation's arrays follow the training set's order)."""
    classes = victim.load_train_set().classes
    mem = np.asarray(arrays["memorised"], dtype=bool) if arrays.get("memorised") is not None else np.zeros(len(classes), bool)
    counts = {int(c): int(mem[classes == c].sum()) for c in np.unique(classes)}
    k = len(counts)
    return {"classes": k, "samples_per_class": row["n"] // k, "memorised_per_class": json.dumps(counts),
            "memorised_per_class_mean": row["memorised"] / k,
            "memorised_control_per_class_mean": (row["memorised_control"] or 0) / k}


@register_experiment("multiclass", "More classes at a fixed number of samples per class (Buzaglo): 2, 5 and 10 MNIST "
                     "classes, memorised per class and in total against a held-out control. CPU default: 10 samples per "
                     "class (n = 20, 50, 100), 3 cases of 6000 epochs and 4000 kkt iterations; --full: 50 per class.", _args)
def multiclass_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args)
    per_class = 50 if args.full else 10
    arch = "mlp:1000,1000;init=1e-4" if args.full else "mlp:256,256;init=1e-4"
    rows = []
    for k, task in MC_CLASSES.items():
        case = Case(f"{k} classes", task=task, n=k * per_class, arch=arch, epochs=epochs)
        print(f"case {case.label}: {asdict(case)}")
        row, arrays, victim = run_case(case, iterations, args.seed, out, args.device, progress, resume=args.resume)
        row.update(_per_class(row, arrays, victim))
        print(f"  -> memorised {row['memorised']}/{case.n} (per class {row['memorised_per_class']}), "
              f"control {row['memorised_control']}, {row['case_seconds']} s")
        rows.append(row)
    base = rows[0]
    for r in rows:
        leaks = r["memorised"] > (r["memorised_control"] or 0)
        if r is base:
            r["paper_claim"] = "reference (2 classes); " + ("leaks beyond control" if leaks else "no leak beyond control")
        else:
            more = r["memorised_per_class_mean"] > base["memorised_per_class_mean"] and leaks
            r["paper_claim"] = "agrees" if more else "disagrees"
    _bars(rows, out / "multiclass.png", f"{per_class} samples per class: 2, 5, 10 classes")
    verdicts = [r["paper_claim"] for r in rows[1:]]
    this_run = "; ".join(f"{r['classes']} classes (n={r['n']}): memorised {r['memorised']} "
                         f"({r['memorised_per_class_mean']:.1f}/class), control {r['memorised_control']}, "
                         f"one-to-one {r['one_to_one_ssim>=0.4']} -> {r['paper_claim']}" for r in rows)
    return finish(out, "multiclass", rows, MC_CLAIM, this_run, all(v == "agrees" for v in verdicts),
                  {"iterations": iterations, "epochs": epochs, "samples_per_class": per_class, "arch": arch})


@register_experiment("width-vs-n", f"Reconstructed fraction against (number of parameters)/(n·d) (Buzaglo). {BUDGET}.", _args)
def width_vs_n_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args)
    widths = [64, 256, 1000, 4000] if args.full else [32, 128, 512]
    n = 500 if args.full else 50
    rows, _ = _run_all([Case(f"width {w}", n=n, arch=f"mlp:{w},{w};init=1e-4") for w in widths], args, epochs, iterations, out, progress)
    fig, ax = subplots(figsize=(5, 3.4))
    x = [r["params_per_nd"] for r in rows]
    ax.semilogx(x, [r["reconstructed_fraction"] for r in rows], "o-", label="SSIM>=0.4 (one-to-one)")
    ax.semilogx(x, [r["memorised_fraction"] for r in rows], "s-", label="memorised")
    ax.set(xlabel="parameters / (n·d)", ylabel="fraction of training set", title=f"width vs n (n={n})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "width-vs-n.png", dpi=110)
    fr = [r["reconstructed_fraction"] for r in rows]
    agrees = fr[-1] > fr[0]
    return finish(out, "width-vs-n", rows, "reconstructability grows with the number of parameters relative to n·d",
                  f"reconstructed fraction {', '.join(f'{f:.2f}' for f in fr)} at parameters/(n·d) = {', '.join(f'{v:.2f}' for v in x)}",
                  agrees, {"iterations": iterations, "epochs": epochs, "n": n})


def _bars(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    fig, ax = subplots(figsize=(1.6 * len(rows) + 2, 3.4))
    xs = np.arange(len(rows))
    ax.bar(xs - 0.27, [r["one_to_one_ssim>=0.4"] for r in rows], 0.27, label="SSIM>=0.4 one-to-one")
    ax.bar(xs, [r["memorised"] for r in rows], 0.27, label="memorised")
    ax.bar(xs + 0.27, [r["memorised_control"] or 0 for r in rows], 0.27, label="memorised, held-out control")
    ax.set_xticks(xs, [r["case"] for r in rows], fontsize=7)
    ax.set(ylabel="training images", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


CNN_BUDGET = "CPU default: one CNN victim (12,000 epochs) attacked twice, 4000 iterations each"


@register_experiment("cnn", "A convolutional victim leaks its training images through the same stationarity equation (Buzaglo), "
                     f"attacked without and with a total-variation image prior. {CNN_BUDGET}.", _arguments(12_000))
def cnn_experiment(args: argparse.Namespace) -> dict[str, Any]:
    out, iterations, epochs, progress = _setup(args, default_epochs=12_000)
    n = 500 if args.full else 100
    arch = "cnn:32;fc=1000;pool=avg" if args.full else "cnn:16;fc=256;pool=avg"
    cases = [Case("no image prior", n=n, arch=arch), Case("tv prior 1e-4", n=n, arch=arch, attack=(("tv_weight", 1e-4),))]
    rows, _ = _run_all(cases, args, epochs, iterations, out, progress, figures=True)
    _bars(rows, out / "cnn.png", f"CNN victim {arch} (n={n})")
    leaks = [r["memorised"] > (r["memorised_control"] or 0) for r in rows]
    return finish(out, "cnn", rows,
                  "CNN classifiers leak training samples through the same stationarity equation as MLPs",
                  "; ".join(f"{r['case']}: {r['one_to_one_ssim>=0.4']} one-to-one, {r['memorised']} memorised "
                            f"(control {r['memorised_control']})" for r in rows)
                  + f"; best pairs in {out}/<case>/evaluation/best_pairs.png",
                  any(leaks), {"iterations": iterations, "epochs": epochs, "n": n, "arch": arch})
