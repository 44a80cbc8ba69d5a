"""``exhume experiment tldr``: network inversion vs training-like reconstruction (TLDR).

Part A: one convnet victim (``--n`` images); the ``inversion`` and ``tldr`` attacks on it; each
judged per class against the training set and against a held-out set of the same size.
Part B: ``tldr`` on victims trained on ``--sizes`` images (the paper's 1k / 10k / full trend).
Writes per-class grids (``*_grid.png``), ``results.json`` and ``table.txt`` in the run folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from exhume.deadline import NEVER, Deadline
from exhume.errors import ConfigError
from exhume.experiments.registry import register_experiment

HELP = ("TLDR: inversion vs tldr reconstruction on a convnet victim, then tldr quality vs training-set size. "
        "CPU default: bundled MNIST, sizes 1000,2000,5000, 300 generator steps, one thread. "
        "--full: the paper's scale (Fashion-MNIST 1k/10k/50k, 5000 steps; needs dataset-fashion-mnist and a GPU).")

PAPER_CLAIM = ("reconstructions of MNIST / Fashion-MNIST look like training images at 1k training samples and "
              "degrade as the training set grows to 10k and 60k (visual, no number given)")


#: the attacks this experiment compares (plain inversion and TLDR), and the one it runs at every training-set size
METHODS = ("inversion", "tldr")
#: generator steps between an attack's checkpoints (a capped attack resumes from its last)
CHECKPOINT_EVERY = 250
EVERY_SIZE = "tldr"

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="dataset (default mnist = the bundled 10k digits; --full: fashion-mnist)")
    p.add_argument("--root", default=None, help="dataset location if not the default")
    p.add_argument("--arch", default="convnet:32,64;fc=128;dropout=0.25;slope=0.01", help="victim architecture")
    p.add_argument("--sizes", default=None, help="comma-separated training-set sizes for part B (default 1000,2000,5000)")
    p.add_argument("--epochs", type=int, default=None, help="victim training epochs (default 10; --full 20)")
    p.add_argument("--wd", type=float, default=0.0, help="victim weight decay (default 0)")
    p.add_argument("--steps", type=int, default=None, help="generator steps per attack (default 300; --full 5000)")
    p.add_argument("--samples-per-class", type=int, default=10, help="candidates per class (default 10)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="wall-time cap per attack (its deadline, from its start); a capped attack is finished by running the "
                        "same command again with --resume (it resumes from its checkpoint)")
    p.add_argument("--resume", action="store_true", help="reuse the victims and finished attacks in --out and continue the "
                   "capped ones from their checkpoints")
    p.add_argument("--methods", default=",".join(METHODS), help=f"attacks on the first size (default {','.join(METHODS)}; "
                   f"later sizes run {EVERY_SIZE} only)")


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 10:
        raise ConfigError(f"--sizes needs training-set sizes of at least 10, got {text!r}")
    return sizes


def _victim(data, root, arch, n, epochs, wd, seed, progress, folder: Path, resume: bool):
    from exhume.victim import MiniBatchConfig, load_victim, make_minibatch_victim

    if resume and (folder / "victim.json").is_file():
        return load_victim(folder)
    v = make_minibatch_victim(data, "multiclass", n, arch, MiniBatchConfig(epochs=epochs, weight_decay=wd), seed=seed,
                              root=root, progress=progress)
    v.save(folder)
    return v


def _heldout(victim, seed: int):
    """Unseen images of the same dataset, as many as the training set (fewer if the dataset runs out)."""
    from exhume.data import dataset_of, make_pool

    spec = victim.data_spec
    ds = dataset_of(spec)
    return make_pool(ds, "multiclass", int(spec["n"]), exclude=victim.train_indices, seed=seed)


def _attack_and_judge(method: str, victim, held, out: Path, cfg: dict[str, Any], seed: int, progress: bool,
                      device: str = "cpu", resume: bool = False, deadline: Deadline = NEVER) -> dict[str, Any]:
    """One attack (until ``deadline``), its candidates judged against the training and held-out images."""
    from exhume.attacks import get_attack, load_reconstruction
    from exhume.evaluation.trainlike import class_grid, per_class_evaluation
    from exhume.evaluation.trainlike_stats import membership_tests

    folder = out / method
    recon = load_reconstruction(folder) if resume and (folder / "reconstruction.json").is_file() else None
    if recon is None or recon.record.iterations < cfg["steps"]:  # absent, or capped by --max-seconds: resume
        recon = get_attack(method, **cfg).run(victim.attacker_view(), out=folder, seed=seed, progress=progress, resume=resume,
                                              device=device, deadline=deadline, checkpoint_every=CHECKPOINT_EVERY)
        recon.save(folder)
    train = victim.train_set
    t0 = time.perf_counter()
    ev = per_class_evaluation(recon.candidates, recon.labels, train.x, train.y, held.x, held.y)
    ev["membership_test"] = membership_tests(recon.candidates, recon.labels, train.x, train.y, held.x, held.y, seed)
    grid = class_grid(recon.candidates, recon.labels, folder / f"{method}_grid.png", cfg.get("samples_per_class", 10),
                      title=f"{method} on {victim.data_spec['dataset']} n={victim.data_spec['n']} (title: classifier p(label))",
                      scores=recon.scores)
    (folder / "trainlike.json").write_text(json.dumps(ev, indent=2))
    record = recon.record  # the accuracies: the inversion attacks' own notes (its extras)
    return {"method": method, "grid": str(grid), "attack_seconds": record.seconds,
            "evaluation_seconds": round(time.perf_counter() - t0, 2),
            "classifier_accuracy_on_candidates": record.extras["classifier_accuracy_on_candidates"],
            "classifier_accuracy_per_class": record.extras["classifier_accuracy_per_class"],
            **{k: v for k, v in ev.items() if k not in ("per_class", "note")}}


def _victim_separation(victim, held, eps: float) -> dict[str, Any]:
    """Do the signals TLDR optimises separate this victim's training images from held-out ones?"""
    from exhume.evaluation.trainlike_stats import signal_separation, victim_signals

    train = victim.train_set
    mean = victim.mean.float()
    sig_t = victim_signals(victim.model, train.x.float() - mean, train.y, eps)
    sig_h = victim_signals(victim.model, held.x.float() - mean, held.y, eps)
    return {"fgsm_eps": eps, "n_train": len(train), "n_heldout": len(held), **signal_separation(sig_t, sig_h)}


def _row(r: dict[str, Any]) -> str:
    return (f"{r['label']:<22} acc {r['classifier_accuracy_on_candidates']:.2f} (min class {min(r['classifier_accuracy_per_class']):.2f})  "
            f"SSIM→train {r['ssim_to_train_mean']:.3f}  SSIM→held {r['ssim_to_heldout_mean']:.3f}  "
            f"L2→train {r['l2_to_train_mean']:.2f}  L2→held {r['l2_to_heldout_mean']:.2f}  "
            f"nearer-train {r['frac_nearer_train_ssim']:.2f}  "
            f"1:1 SSIM≥0.4 train {r['train_one_to_one_ssim>=0.4']}  held {r['held_one_to_one_ssim>=0.4']}  "
            f"binomial p (SSIM/L2) {r['membership_test']['ssim']['binomial_p']:.3g}/{r['membership_test']['l2']['binomial_p']:.3g}")


def _signal_row(n: int, sep: dict[str, Any]) -> str:
    return f"victim n={n} train vs held-out: " + "  ".join(
        f"{k} AUC {sep[k]['auc']:.3f} (p {sep[k]['mannwhitney_p']:.2g})" for k in ("confidence", "grad_norm", "fgsm_confidence"))


@register_experiment("tldr", HELP, add_arguments)
def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(max(1, int(getattr(args, "threads", 1))))
    full = bool(getattr(args, "full", False))
    data = args.data or ("fashion-mnist" if full else "mnist")
    sizes = _parse_sizes(args.sizes or ("1000,10000,50000" if full else "1000,2000,5000"))
    epochs = args.epochs or (20 if full else 10)
    steps = args.steps or (5000 if full else 300)
    if epochs < 1 or steps < 1 or args.samples_per_class < 1:
        raise ConfigError("--epochs, --steps and --samples-per-class must be positive")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    cfg = {"steps": steps, "samples_per_class": args.samples_per_class}
    deadline = Deadline.never()  # the experiment's own (none): each attack takes --max-seconds of it from its start
    first_methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    if not first_methods or set(first_methods) - set(METHODS):
        raise ConfigError(f"--methods must list {' and/or '.join(METHODS)}, got {args.methods!r}")
    t0 = time.perf_counter()
    results: dict[str, Any] = {"settings": {"data": data, "arch": args.arch, "sizes": sizes, "victim_epochs": epochs,
                                            "weight_decay": args.wd, "generator_steps": steps,
                                            "samples_per_class": args.samples_per_class, "seed": args.seed,
                                            "threads": torch.get_num_threads(), "held_out": "same size as the training set, disjoint, same classes"},
                               "paper_claim": PAPER_CLAIM, "runs": []}
    rows = []
    for i, n in enumerate(sizes):
        vdir = out / f"n{n}"
        victim = _victim(data, args.root, args.arch, n, epochs, args.wd, args.seed, progress, vdir / "victim", args.resume)
        held = _heldout(victim, args.seed + 777)
        sep = _victim_separation(victim, held, 0.05)
        results.setdefault("victim_signal_separation", {})[f"n{n}"] = sep
        rows.append(_signal_row(n, sep))
        methods = first_methods if i == 0 else [EVERY_SIZE]
        for method in methods:
            r = _attack_and_judge(method, victim, held, vdir, cfg, args.seed, progress, args.device, args.resume,
                                  deadline.sooner(args.max_seconds))  # each attack's cap, from its start
            r.update(n_train=n, n_heldout=len(held), victim_train_accuracy=victim.metrics.get("train_accuracy"),
                     victim_test_accuracy=victim.metrics.get("test_accuracy"), label=f"{method} n={n}")
            results["runs"].append(r)
            rows.append(_row(r))
            (out / "results.json").write_text(json.dumps(results, indent=2))
    results["seconds"] = round(time.perf_counter() - t0, 1)
    table = "\n".join(rows)
    (out / "table.txt").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(table)
    return {"out": str(out), "seconds": results["seconds"], "paper_claim": PAPER_CLAIM,
            "victim_signal_separation": results.get("victim_signal_separation"),
            "runs": [{k: r[k] for k in ("label", "classifier_accuracy_on_candidates", "ssim_to_train_mean", "ssim_to_heldout_mean",
                                        "l2_to_train_mean", "l2_to_heldout_mean", "frac_nearer_train_ssim", "membership_test",
                                        "grid")} for r in results["runs"]]}
