"""Which control images a run matched, and why: faithful reconstructions of look-alike training images?

    python research/control_hits.py --victim runs/demo/victim --run runs/demo/attack

The control counts held-out non-members that some candidate resembles (SSIM) more than any of the
1000 pool images, exactly as the memorisation count does for the training images. A control image
that looks like a training image is matched by a good reconstruction of that training image: the
*oracle control* (the training images themselves given as candidates, ``memorised_control_oracle``
in every evaluation) is what a perfect attack would score. For each control image the run matched,
this prints the candidate, its SSIM to the control image and to the best pool image, the training
image nearest to the candidate (SSIM) and that training image's own SSIM to the control image, the
candidate's attacker-side rank (percentile in the pool) and whether the control image is one the
oracle matches too. Evaluator-side: it reads the training set. Same pool and control split as
``exhume evaluate`` (pool seed 1, 1000 images).
"""

from __future__ import annotations

import argparse

import numpy as np

import exhume
from exhume.attacks import load_reconstruction
from exhume.evaluation.matching import rule_similarity
from exhume.evaluation.metrics import evaluate_images
from exhume.evaluation.run import _victim_sets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--victim", required=True, help="a victim folder (exhume train / demo)")
    ap.add_argument("--run", required=True, help="a reconstruction folder (exhume attack)")
    ap.add_argument("--pool-size", type=int, default=1000)
    args = ap.parse_args(argv)
    victim, recon = exhume.load_victim(args.victim), load_reconstruction(args.run)
    train, control, pool, _ = _victim_sets(victim, args.pool_size, 1)
    cands = recon.candidates.float().clamp(0, 1)
    mem = evaluate_images(cands, train.x, pool).metrics["memorised"]
    ctrl = evaluate_images(cands, control, pool)
    oracle = evaluate_images(train.x, control, pool)
    hits, oracle_hits = np.nonzero(ctrl.arrays["memorised"])[0], set(np.nonzero(oracle.arrays["memorised"])[0].tolist())
    rank = recon.provenance.get("rank")
    print(f"{len(cands)} candidates: memorised {mem} / {len(train.x)}, control {len(hits)} / {len(control)}, "
          f"oracle control {len(oracle_hits)} / {len(control)} (training images as candidates: {sorted(oracle_hits)})")
    print("| control image | candidate | SSIM to it | best pool | nearest training image (SSIM to candidate) | "
          "that training image's SSIM to the control image | rank percentile | oracle hit too |")
    print("|---|---|---|---|---|---|---|---|")
    for i in hits:
        k = int(ctrl.arrays["best_candidate"][i])
        to_train = rule_similarity(cands[k:k + 1], train.x).numpy()[0]
        j = int(to_train.argmax())
        tc = float(rule_similarity(train.x[j:j + 1], control[i:i + 1])[0, 0])
        pct = "–" if rank is None else f"{float((rank < rank[k]).float().mean()):.2f}"
        print(f"| {i} | {k} | {ctrl.arrays['ssim'][i]:.3f} | {ctrl.arrays['pool_ssim'][i]:.3f} | {j} ({to_train[j]:.3f}) | "
              f"{tc:.3f} | {pct} | {'yes' if i in oracle_hits else 'no'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
