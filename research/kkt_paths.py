"""One kkt run per derivative path on a saved victim, judged: equal iterations or equal seconds.

The paths of ``bench_iteration.py --kkt`` give equal results up to rounding; this checks that the
reconstructions agree after many iterations (rounding grows in a non-convex run) and what each
path finds in the same wall-clock budget. ``main`` is kkt with the surrogate ReLU as the composite
of stock operations (the code before the one-node surrogate), eager; ``double-backward`` and
``jvp`` are kkt's ``mixed_derivative`` (eager); ``traced`` is the double backward replayed (kkt's
default). Every run is kkt with its defaults otherwise (one run, not the portfolio), seed 0,
judged by :func:`exhume.evaluate` (1000 unseen pool images, the control on held-out non-members:
evaluator-side, it reads the training set). The paths run one after another in one process, so
all of them keep freed memory (:func:`exhume.heap.retained_heap`, process-wide): ``main`` here is
main's surrogate, not main's whole speed.

    taskset -c 0 env OMP_NUM_THREADS=1 python research/kkt_paths.py runs/zoo/victims/mnist-cnn-wd5e-3 \\
        --iterations 600 --paths main traced jvp
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import exhume  # noqa: E402
from benchmarks.bench_iteration import STEP_PATHS, composite_surrogate  # noqa: E402
from exhume.attacks import get_attack  # noqa: E402
from exhume.victim import load_victim  # noqa: E402


def run_path(victim, path: str, iterations: int | None, seconds: float | None, seed: int) -> dict:
    mixed, trace, _, composite = STEP_PATHS[path]
    budget = {"iterations": iterations or 10_000_000, "max_seconds": seconds}
    with composite_surrogate(composite):
        recon = get_attack("kkt", mixed_derivative=mixed, trace=trace, **budget).run(victim.attacker_view(), seed=seed,
                                                                                     progress=False)
    m = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
    return {"path": path, "iterations": recon.summary["iterations"], "seconds": recon.summary["seconds"],
            "ms_per_iteration": 1000 * recon.summary["seconds"] / recon.summary["iterations"],
            "final_relative_stationarity": recon.summary["final_relative_stationarity"],
            "memorised": m["memorised"], "control": m.get("memorised_control"), "one_to_one": m["one_to_one_ssim>=0.4"],
            "candidates": recon.candidates}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("victim", type=Path, help="a victim folder (exhume train / benchmarks/zoo/run.py build)")
    ap.add_argument("--paths", nargs="+", default=["main", "traced", "jvp"], choices=[p for p in STEP_PATHS if "/" not in p])
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if (args.iterations is None) == (args.seconds is None):
        ap.error("give exactly one budget: --iterations or --seconds")
    torch.set_num_threads(args.threads)
    victim = load_victim(args.victim)
    rows = [run_path(victim, p, args.iterations, args.seconds, args.seed) for p in args.paths]
    first = rows[0]["candidates"]
    print("| path | iterations | attack s | ms/iteration | final rel. stationarity | memorised | control | one-to-one | "
          f"max abs diff to {rows[0]['path']} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        diff = float((r.pop("candidates") - first).abs().max())
        r["max_abs_diff_to_first"] = diff
        print(f"| {r['path']} | {r['iterations']} | {r['seconds']:.1f} | {r['ms_per_iteration']:.1f} | "
              f"{r['final_relative_stationarity']:.4f} | {r['memorised']} | {r['control']} | {r['one_to_one']} | {diff:.2e} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
