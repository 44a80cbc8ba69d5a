"""Time the pool's merge (``near_duplicates``) on 20,000 candidates of three kinds, one thread.

    OMP_NUM_THREADS=1 python benchmarks/pool_merge.py [--against OTHER/exhume/portfolio/pool.py] [-m 20000]

The kinds: distinct digits (the 10,000 bundled MNIST digits and their mirror images, odd/even labels),
2,500 digits with 8 noisy copies each (noise 0 to 0.1: restarts converging on one image), and noise
around the data mean (candidates that never left it). Prints candidates kept, wall and CPU seconds;
with ``--against``, the same for another tree's ``pool.py`` loaded beside this one, and whether the
owners are the same.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch

import exhume
from exhume.portfolio.pool import near_duplicates

MNIST = Path(exhume.__file__).parent / "data" / "mnist_subset.npz"


def pools(m: int = 20_000):
    g = torch.Generator().manual_seed(0)
    d = np.load(MNIST)
    digits = torch.from_numpy(d["images"]).float().div(255).unsqueeze(1)
    lab = torch.from_numpy(d["labels"] % 2).float()
    yield "distinct digits", torch.cat([digits, digits.flip(-1)])[:m], torch.cat([lab, lab])[:m]
    base = digits[:m // 8].repeat(8, 1, 1, 1)
    noise = torch.tensor([0.0, 1e-3, 3e-3, 1e-2, 2e-2, 3e-2, 5e-2, 1e-1]).repeat_interleave(m // 8)[:, None, None, None]
    yield "8 noisy copies of m/8 digits", (base + noise * torch.randn(base.shape, generator=g)).clamp(0, 1), lab[:m // 8].repeat(8)
    mean = digits.mean(0, keepdim=True)
    yield "noise around the mean", (mean + 0.05 * torch.randn(m, 1, 28, 28, generator=g)).clamp(0, 1), (torch.arange(m) % 2).float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="another tree's exhume/portfolio/pool.py")
    ap.add_argument("-m", type=int, default=20_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    merges = {"this": near_duplicates}
    if args.against:
        spec = importlib.util.spec_from_file_location("other_pool", args.against)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        merges["other"] = other.near_duplicates
    mean = torch.from_numpy(np.load(MNIST)["images"].mean(0) / 255).float().unsqueeze(0)
    for name, cands, labels in pools(args.m):
        order = torch.randperm(cands.shape[0], generator=torch.Generator().manual_seed(1))
        owners = {}
        for tag, merge in merges.items():
            t, cpu = time.perf_counter(), time.process_time()
            kept, owners[tag] = merge(cands, labels, order, mean=mean)
            print(f"{name} [{tag}]: {len(kept)} kept, {time.perf_counter() - t:.2f} s wall, {time.process_time() - cpu:.2f} s CPU", flush=True)
        if len(owners) == 2:
            print(f"{name}: same owners: {torch.equal(owners['this'], owners['other'])}", flush=True)


if __name__ == "__main__":
    main()
