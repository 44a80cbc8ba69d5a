"""Which training images an attack recovers, by training margin: the support estimate checked on a victim.

    python research/support.py --victim runs/zoo/victims/mnist-256-haim --seconds 40 --threads 1 \\
        --params '{"lr_lambda": 1e-4}'

Runs one kkt attack (``--restarts 1``, the default) or the default portfolio (``--restarts auto``)
on a saved victim, evaluates it with ``exhume.evaluate`` (1000 unseen pool images), and prints the
victim's ``support_estimate`` and the memorised count in each tenth of the training set sorted by
margin (evaluator-side: it reads the training set).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import exhume
from exhume.victim import load_victim


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True, help="a saved victim folder (exhume train / benchmarks/zoo)")
    ap.add_argument("--seconds", type=float, default=40.0, help="attack wall time")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restarts", default="1", help="1 (one kkt run) or 'auto' (the default portfolio)")
    ap.add_argument("--params", default="{}", help="kkt overrides as JSON")
    ap.add_argument("--bins", type=int, default=10, help="margin-sorted groups")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    victim = load_victim(args.victim)
    restarts = args.restarts if args.restarts == "auto" else int(args.restarts)
    recon = exhume.attack(victim.attacker_view(), method="kkt", max_seconds=args.seconds, seed=args.seed,
                          restarts=restarts, progress=False, **json.loads(args.params))
    res = exhume.evaluate(recon, victim, pool_size=1000, figures=False)
    m, q, mem = res.metrics, res.arrays["margin"], res.arrays["memorised"].astype(bool)
    print(f"{victim.path}: memorised {m['memorised']} / control {m['memorised_control']}, one-to-one SSIM >= 0.4 "
          f"{m['one_to_one_ssim>=0.4']}; support estimate {m['support_estimate']:.1f} of {len(q)}")
    order = np.argsort(q)
    print("| training images by margin (rank) | margins | memorised |\n|---|---|---|")
    for ranks in np.array_split(np.arange(len(q)), args.bins):
        part = order[ranks]
        print(f"| {ranks[0]}–{ranks[-1]} | {q[part].min():.2f}–{q[part].max():.2f} | {int(mem[part].sum())} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
