"""Reconstruction quality against wall-clock time for the demo configuration (or a saved victim).

Trains the demo's victim (``exhume.demo.DEMO_DATA`` / ``DEMO_TRAIN``), runs the ``kkt`` attack with
``exhume.demo.DEMO_ATTACK`` (read at run time; its seconds, ``DEMO_ATTACK_SECONDS``, overridden by ``--seconds``)
and, every ``--every`` iterations, evaluates the current candidates against the training set and a
pool of 1000 unseen digits of the same classes (seed 1, disjoint from the training set). Each row:
iteration, attack seconds, ``ssim>=0.4`` (training images with a candidate of SSIM >= 0.4),
``one_to_one_ssim>=0.4`` (the same under a one-to-one matching), ``memorised`` (training images whose
best candidate is closer to them than to every pool image). A last row evaluates the attack's final
candidates.

The attack seconds exclude evaluation time: the attack pauses its clock while the callback runs
(``KKTAttack.run``), so the curve is what an attack with that budget alone would reach.

``--victim FOLDER`` attacks a saved victim instead (for example a zoo victim, ``benchmarks/zoo/``):
no training, kkt's own defaults (not the demo's), an iteration cap high enough for ``--seconds`` to
end the run, and the pool drawn the same way from the victim's dataset. ``--params JSON`` overrides
kkt parameters in either mode.

Writes ``quality.csv`` and ``quality.png`` to ``--out`` (default ``runs/bench_quality/``).

    python benchmarks/bench_quality.py                                  # the demo's budgets
    python benchmarks/bench_quality.py --train-seconds 3 --seconds 10 --every 200   # smoke test
    python benchmarks/bench_quality.py --victim runs/zoo/victims/mnist-256-haim --seconds 180 --every 1000 \
        --threads 1 --params '{"lr_lambda": 1e-2}'
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import exhume.demo as demo  # noqa: E402
from exhume.attacks import get_attack  # noqa: E402
from exhume.data import dataset_of, load_dataset, make_pool  # noqa: E402
from exhume.deadline import Deadline  # noqa: E402
from exhume.evaluation import evaluate_images  # noqa: E402
from exhume.victim import TrainConfig, load_victim, make_victim  # noqa: E402

POOL_SIZE, POOL_SEED = 1000, 1
COLUMNS = ("iteration", "attack_seconds", "ssim>=0.4", "one_to_one_ssim>=0.4", "memorised", "eval_seconds")
CURVES = (("ssim>=0.4", "SSIM ≥ 0.4 (best candidate)"), ("one_to_one_ssim>=0.4", "SSIM ≥ 0.4 (one-to-one)"),
          ("memorised", "memorised (beats the 1000-image pool)"))


def plot(rows: list[dict], path: Path, n_train: int, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    secs = [r["attack_seconds"] for r in rows]
    for key, label in CURVES:
        ax.plot(secs, [r[key] for r in rows], marker="o", ms=3, label=label)
    ax.set_xlabel("attack wall-clock seconds (evaluation time excluded)")
    ax.set_ylabel(f"training images (of {n_train})")
    top = max([r[key] for r in rows for key, _ in CURVES] + [0])
    ax.set_ylim(0, max(5, top * 1.1 + 1))
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-seconds", type=float, default=demo.DEMO_TRAIN["max_seconds"],
                    help="victim training budget in seconds (default: the demo's, %(default)s)")
    ap.add_argument("--seconds", type=float, default=demo.DEMO_ATTACK_SECONDS,
                    help="attack budget in seconds, evaluation excluded (default: the demo's, %(default)s)")
    ap.add_argument("--every", type=int, default=2500, help="evaluate every this many iterations (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="victim and attack seed (the demo's is 0)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_quality"), help="output folder (default %(default)s)")
    ap.add_argument("--victim", type=Path, default=None,
                    help="attack this saved victim folder instead of training the demo's (kkt defaults, no training)")
    ap.add_argument("--params", type=json.loads, default={},
                    help="kkt parameter overrides as a JSON object, e.g. '{\"lr_lambda\": 1e-2}'")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) first (default: torch's own default; on a machine shared with "
                         "other busy processes, fewer threads than cores can be much faster)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args.every < 1:
        ap.error("--every must be >= 1")
    if not args.seconds > 0 or not args.train_seconds > 0:
        ap.error("--seconds and --train-seconds must be > 0")

    if not isinstance(args.params, dict):
        ap.error("--params must be a JSON object")
    saved = args.victim is not None  # attack a saved victim instead of training the demo's
    if not saved:
        data, train_settings = dict(demo.DEMO_DATA), dict(demo.DEMO_TRAIN)
        attack_settings = {**demo.DEMO_ATTACK, **args.params}
    else:
        data, train_settings = {"victim": str(args.victim)}, None
        attack_settings = {"iterations": 10_000_000, **args.params}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; python {platform.python_version()}")
    if saved:
        print(f"victim: saved in {args.victim}; attack seed {args.seed}")
    else:
        print(f"victim: {data} with {train_settings} (max_seconds -> {args.train_seconds:g}), seed {args.seed}")
    print(f"attack: kkt {attack_settings} for {args.seconds:g} s; evaluation every {args.every} iterations")
    print("note: evaluation time is excluded from the attack seconds (the attack's clock is paused during "
          "each evaluation); eval_seconds is reported separately")
    print(flush=True)

    t0 = time.perf_counter()
    if saved:
        victim = load_victim(args.victim)
        dataset = dataset_of(victim.data_spec)
        train = victim.load_train_set(dataset)
    else:
        victim = make_victim(data["data"], data["task"], data["n"], data["arch"],
                             TrainConfig(**{**train_settings, "max_seconds": args.train_seconds}),
                             seed=args.seed, progress=False)
        dataset, train = load_dataset(data["data"]), victim.train_set
    vm = victim.metrics
    print(f"victim {'loaded' if saved else 'trained'} in {time.perf_counter() - t0:.1f} s: train accuracy {vm['train_accuracy']:.3f}, "
          f"test accuracy {vm.get('test_accuracy', float('nan')):.3f}, epochs {vm.get('epochs')}, "
          f"relative stationarity residual {vm.get('stationarity_residual')}", flush=True)

    pool = make_pool(dataset, train.spec["task"], POOL_SIZE, exclude=train.indices, seed=POOL_SEED)
    n_train = int(train.x.shape[0])

    rows: list[dict] = []

    def evaluate(iteration: int, seconds: float, candidates: torch.Tensor) -> dict:
        t = time.perf_counter()
        metrics = evaluate_images(candidates.float().clamp(0, 1), train.x, pool.x).metrics
        row = {"iteration": int(iteration), "attack_seconds": round(float(seconds), 3),
               **{key: metrics[key] for key, _ in CURVES},
               "eval_seconds": round(time.perf_counter() - t, 3)}
        rows.append(row)
        print(f"  it {row['iteration']:>8}  {row['attack_seconds']:8.1f} s   ssim>=0.4 {row['ssim>=0.4']:>4}   "
              f"one-to-one {row['one_to_one_ssim>=0.4']:>4}   memorised {row['memorised']:>4}   "
              f"(eval {row['eval_seconds']:.1f} s)", flush=True)
        return row

    attack = get_attack("kkt", **attack_settings)
    recon = attack.run(victim.attacker_view(), seed=args.seed, progress=False, callback=evaluate, callback_every=args.every,
                       deadline=Deadline.after(args.seconds))  # the evaluations' time is not charged to it
    final_it, final_s = int(recon.summary["iterations"]), float(recon.summary["seconds"])
    if not rows or rows[-1]["iteration"] != final_it:
        evaluate(final_it, final_s, recon.candidates)
    rows[-1]["final"] = True

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "quality.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    trained = f"victim {args.victim.name}" if saved else f"victim trained {args.train_seconds:g} s"
    title = (f"kkt attack, {'saved victim' if saved else 'demo configuration: ' + data['arch']}, "
             f"n={n_train}, m={recon.config.get('m')}\n"
             f"{trained}; pool of {len(pool)} unseen images; {torch.get_num_threads()} threads")
    png_path = plot(rows, args.out / "quality.png", n_train, title)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "data": data,
            "train": None if saved else {**train_settings, "max_seconds": args.train_seconds},
            "attack": {**attack_settings, "seconds": args.seconds},
            "seed": args.seed, "every": args.every, "pool_size": len(pool), "pool_seed": POOL_SEED,
            "victim_metrics": vm, "attack_summary": recon.summary,
            "note": "attack_seconds exclude evaluation time (the attack's clock is paused during each evaluation)"}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))

    print()
    print(f"n_train {n_train}, m {recon.config.get('m')}, pool {len(pool)}; "
          f"{final_it} iterations in {final_s:.1f} s of attack time")
    print("| iteration | attack s | ssim>=0.4 | one_to_one_ssim>=0.4 | memorised |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['iteration']} | {r['attack_seconds']:.1f} | {r['ssim>=0.4']} | {r['one_to_one_ssim>=0.4']} | {r['memorised']} |")
    print()
    print("attack seconds exclude evaluation time (the attack's clock is paused while each evaluation runs)")
    print(f"wrote {csv_path}, {png_path}, {args.out / 'meta.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
