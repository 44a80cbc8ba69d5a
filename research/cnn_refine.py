"""kkt on the whole network, started from an earlier run's candidates (one-off, not maintained).

    python research/cnn_refine.py VICTIM RUN --out DIR --seconds 120 [-p KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json

import torch

import exhume
from exhume.attacks import load_reconstruction
from exhume.victim import load_victim


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("victim")
    ap.add_argument("run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-p", action="append", default=[])
    a = ap.parse_args()
    torch.set_num_threads(1)
    settings = {}
    for kv in a.p:
        k, _, v = kv.partition("=")
        settings[k] = json.loads(v) if v[:1] in "0123456789-[{\"tf" else v
    victim = load_victim(a.victim)
    prev = load_reconstruction(a.run)
    recon = exhume.attack(victim, method="kkt", seed=a.seed, max_seconds=a.seconds, restarts=1, progress=False,
                          init=prev.candidates.float(), init_name="features", **settings)
    recon.save(a.out)
    print(json.dumps(recon.summary, default=str))


if __name__ == "__main__":
    main()
