"""Screen portfolio variants at a fixed iteration budget: alone, and mixed half and half.

    python benchmarks/variant_screen.py --victim runs/zoo/victims/mnist-256-haim --out runs/screen/mnist-256-haim \\
        --restarts 4 --iterations 2500 \\
        --configs '{"default": [{}, {"lr_lambda": 1e-4}], "a45": [{"alpha": 45}, {"alpha": 45, "lr_lambda": 1e-4}]}'

Each config (a name and a portfolio ``variants`` list) runs as a kkt portfolio of ``--restarts``
restarts (seeds ``--seed`` + k, restart k with ``variants[k % len]``) of exactly ``--iterations``
iterations each, two parallel workers, saved under ``OUT/<name>/`` (a rerun reuses what is there).
Then every config's pool is scored with ``exhume.evaluate`` (1000 unseen pool images, the control on
held-out non-members): all its restarts, its first half, and for every pair of configs the first
half of one with the first half of the other, which is the mixed portfolio of the same size.

Why iterations rather than seconds: the comparison does not move with the machine's load (this
machine is shared; a time budget buys a different number of iterations from one run to the next),
and the restarts' seeds are the same in every config, so a pair differs in its settings only.
Candidates are concatenated, not merged (as in ``research/pool_curve.py``). Evaluator-side: reads the
training set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

import exhume

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and exhume_benchmarks.zoo without installing
from exhume_benchmarks.zoo.run import pooled, restart_results  # noqa: E402  (the zoo's concatenation of restarts' candidates)


def run_config(victim, folder: Path, variants: list[dict], restarts: int, iterations: int, seed: int, workers: int) -> list:
    """The config's restarts (run now unless ``folder`` holds them), in restart order."""
    if not (folder / "reconstruction.json").exists():
        t0 = time.perf_counter()
        recon = exhume.attack(victim, "kkt", out=folder, restarts=restarts, workers=workers, variants=variants,
                              iterations=iterations, seed=seed, progress=False, resume=(folder / "restarts").is_dir())
        its = recon.summary.get("iterations_per_restart")
        print(f"ran {folder.name}: {restarts} restarts of {its} iterations in {time.perf_counter() - t0:.0f} s", flush=True)
    return restart_results(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True, help="a victim folder (with its training set's data spec)")
    ap.add_argument("--out", required=True, help="folder for the configs' portfolios (OUT/<name>/)")
    ap.add_argument("--configs", required=True, help='JSON: {"name": [variant, ...], ...}')
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=2500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the evaluation")
    args = ap.parse_args(argv)
    configs = json.loads(args.configs)
    if not isinstance(configs, dict) or not configs or not all(isinstance(v, list) and v for v in configs.values()):
        raise SystemExit('--configs: expected a JSON object of non-empty variant lists, e.g. {"default": [{}]}')
    if args.restarts < 2 or args.restarts % 2:
        raise SystemExit(f"--restarts: expected an even number >= 2 (halves are mixed), got {args.restarts}")
    torch.set_num_threads(args.threads)
    victim = exhume.load_victim(args.victim)
    recs = {name: run_config(victim, Path(args.out) / name, variants, args.restarts, args.iterations, args.seed, args.workers)
            for name, variants in configs.items()}
    half = args.restarts // 2

    def row(label: str, rs: list) -> str:
        m = exhume.evaluate(pooled(rs, "kkt", {}), victim, pool_size=1000, figures=False).metrics
        return f"| {label} | {len(rs)} | {m['memorised']} | {m['memorised_control']} | {m['one_to_one_ssim>=0.4']} |"

    print(f"{Path(args.victim).name}: {args.restarts} restarts x {args.iterations} iterations, seeds {args.seed}.."
          f"{args.seed + args.restarts - 1}\n\n| pool | restarts | memorised | control | one-to-one SSIM ≥ 0.4 |\n|---|---|---|---|---|")
    for name, rs in recs.items():
        print(row(f"{name}, all", rs), flush=True)
        print(row(f"{name}, first {half}", rs[:half]), flush=True)
    for a, b in itertools.combinations(recs, 2):
        print(row(f"{a} first {half} + {b} first {half}", recs[a][:half] + recs[b][:half]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
