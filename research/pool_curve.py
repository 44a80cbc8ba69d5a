"""How the pooled memorised count grows with the number of restarts pooled.

    python research/pool_curve.py runs/demo30/attack --victim runs/demo30/victim

Reads a portfolio run's folder (``exhume attack``/``exhume demo`` with restarts: ``restarts/<k>/``
holds each restart's reconstruction), pools the candidates of the first ``k`` restarts for
``k`` = 1, 2, 4, … (all restarts, then the even and the odd ones, which the default kkt portfolio runs
with ``lr_lambda`` 1e-2 and 1e-4) and scores each pool with ``exhume.evaluate`` (1000 unseen pool
images; the control on held-out non-members). Candidates are concatenated, not merged, so a count can
differ by one from the portfolio's own pooled result. Evaluator-side: it reads the training set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import exhume

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402  (the zoo's concatenation of restarts' candidates)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="the portfolio's output folder (with restarts/0, restarts/1, ...)")
    ap.add_argument("--victim", required=True, help="the victim folder (with its training set's data spec)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recons = restart_results(args.run)
    if not recons:
        raise SystemExit(f"no restarts/<k> folders in {args.run}")
    victim = exhume.load_victim(args.victim)
    print("| restarts pooled | which | candidates | memorised | control | one-to-one SSIM ≥ 0.4 |\n|---|---|---|---|---|---|")
    for which, picked in (("all", recons), ("even", recons[0::2]), ("odd", recons[1::2])):
        k = 1
        while k <= len(picked):
            m = exhume.evaluate(pooled(picked[:k], "kkt-restarts", {}), victim, pool_size=1000, figures=False).metrics
            print(f"| {k} | {which} | {m['n_candidates']} | {m['memorised']} | {m['memorised_control']} | "
                  f"{m['one_to_one_ssim>=0.4']} |", flush=True)
            k *= 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
