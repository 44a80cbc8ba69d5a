"""Which training images each of several reconstructions memorises, and what one finds that another misses.

    python benchmarks/zoo/run.py all --out runs/sets --seconds 90 --slots 2 --cores-per-job 1 --keep \\
        --methods new reference --victims fashion-256-haim
    python research/memorised_sets.py --victim runs/sets/victims/fashion-256-haim \\
        runs/sets/reconstructions/fashion-256-haim__new__s0 runs/sets/reconstructions/fashion-256-haim__reference__s0

Each reconstruction folder (anything :func:`exhume.attacks.load_reconstruction` reads) is judged by
:func:`exhume.evaluate` as the zoo judges it (1000 unseen pool images, pool seed 1); the script
prints each one's memorised training images (indices into the training set), for every pair the
images the first memorises and the second does not, and the union. ``--images 97,26`` also prints,
for those training images, the SSIM of each reconstruction's best candidate and of the best pool
image (the bar a candidate must beat). A training image is memorised when its nearest candidate
beats the pool, so the union is exactly what the runs' candidates concatenated would memorise (at
the runs' summed budget; the portfolio's near-duplicate merge could drop a few).
Evaluator-side: it reads the training set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import exhume
from exhume.attacks import load_reconstruction
from exhume.victim import load_victim


def judge(victim, folders: list[str | Path]) -> dict[str, dict[str, np.ndarray]]:
    """``{folder name: the evaluation's per-training-image arrays}``, in the order given."""
    out = {}
    for folder in folders:
        recon = load_reconstruction(folder)
        recon.candidates = recon.candidates.float()
        out[Path(folder).name] = exhume.evaluate(recon, victim, pool_size=1000, figures=False).arrays
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True, help="victim folder (with its training set's data spec)")
    ap.add_argument("runs", nargs="+", help="reconstruction folders")
    ap.add_argument("--images", default="", help="comma-separated training-set indices to print SSIMs for")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    arrays = judge(load_victim(args.victim), args.runs)
    sets = {name: {int(i) for i in np.flatnonzero(a["memorised"])} for name, a in arrays.items()}
    for name, s in sets.items():
        print(f"{name}: {len(s)} memorised {sorted(s)}")
    names = list(sets)
    for a in names:
        for b in names:
            if a != b:
                print(f"in {a}, not in {b}: {len(sets[a] - sets[b])} {sorted(sets[a] - sets[b])}")
    union = set().union(*sets.values())
    print(f"union: {len(union)} {sorted(union)}")
    for i in (int(t) for t in args.images.split(",") if t.strip()):
        pool = next(iter(arrays.values()))["pool_ssim"][i]
        best = ", ".join(f"{name} {a['ssim'][i]:.3f}" for name, a in arrays.items())
        print(f"training image {i}: best pool image {pool:.3f}; best candidate: {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
