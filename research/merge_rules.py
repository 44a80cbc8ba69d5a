"""Judge a portfolio's saved restarts pooled under several near-duplicate rules.

    python research/merge_rules.py --victim runs/zoo/victims/fashion-256-haim --run runs/start/fashion-256-haim/noise \\
        --restarts 2 4

``--run`` holds restarts as ``<k>/`` or ``restarts/<k>/`` folders (a portfolio's run folder, or
``first_layer_start.py``'s). For each number of restarts (the first ``R`` in restart order), their
candidates are pooled as the portfolio pools them (concatenated, ranked attacker-side, merged going
down the ranking: :func:`exhume.portfolio.pool.near_duplicates`) under each rule, and judged by
``exhume.evaluate`` (1000 unseen pool images, the control on held-out non-members): unmerged; the
correlation alone (NCC > 0.95, the rule before 2026-11-26); NCC > 0.95 and SSIM > 0.95; NCC > 0.95
and SSIM > 0.98 (the default). Every pool comes from the same restarts, so the rules differ in the
merge alone. Prints one markdown row per ``R``: memorised / control (candidates). Evaluator-side.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

import exhume
from exhume.portfolio.pool import DUPLICATE_NCC, near_duplicates, rank_scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402  (the zoo's restarts reader and concatenation of candidates)

RULES = (("unmerged", None, None), ("NCC", DUPLICATE_NCC, None), ("NCC + SSIM 0.95", DUPLICATE_NCC, 0.95),
         ("NCC + SSIM 0.98", DUPLICATE_NCC, 0.98))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True, help="a victim folder (with its training set's data spec)")
    ap.add_argument("--run", required=True, help="a folder of saved restarts")
    ap.add_argument("--restarts", type=int, nargs="+", default=[2], help="pool the first R restarts (several: one row each)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    victim = exhume.load_victim(args.victim)
    view = victim.attacker_view()
    recs = restart_results(args.run)
    for r in args.restarts:
        if not 1 <= r <= len(recs):
            raise SystemExit(f"--restarts: {r} asked for, {len(recs)} saved")
        part = recs[:r]
        whole = pooled(part, "kkt", {})
        cands, labels = whole.candidates.float(), whole.labels
        order = torch.argsort(-torch.cat([rank_scores(view, x) for x in part]), stable=True)
        cells = []
        for _, ncc, ssim in RULES:
            kept = order if ncc is None else near_duplicates(cands, labels, order, ncc, mean=view.mean, ssim_threshold=ssim)[0]
            rec = dataclasses.replace(whole, candidates=cands[kept], labels=labels[kept], scores=whole.scores[kept])
            m = exhume.evaluate(rec, victim, pool_size=1000, figures=False).metrics
            cells.append(f"{m['memorised']} / {m['memorised_control']} ({len(kept)})")
        print(f"| {Path(args.victim).name} | {r} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
