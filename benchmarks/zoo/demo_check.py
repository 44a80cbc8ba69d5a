"""The demo's pipeline with the new defaults, timed end to end: train the demo victim, attack, evaluate.

    taskset -c 0,1 python benchmarks/zoo/demo_check.py --out runs/demo_check --seconds 300

Trains the victim of ``exhume demo`` (``exhume.demo.DEMO_DATA`` / ``DEMO_TRAIN``), spends
``--seconds`` on ``--restarts`` kkt restarts with kkt's defaults (budget split evenly, candidates
pooled; the portfolio's restarts run one after the other here), evaluates like the demo
(1000 unseen digits, control on held-out digits) and writes the figures (``best_pairs.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))


def main(argv=None) -> int:
    import torch

    import exhume
    from exhume.demo import DEMO_DATA, DEMO_TRAIN
    from exhume.victim import TrainConfig, make_victim
    from run import restarts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/demo_check")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--restarts", type=int, default=None, help="default: about 45 s each")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    t0 = time.perf_counter()
    victim = make_victim(DEMO_DATA["data"], DEMO_DATA["task"], DEMO_DATA["n"], DEMO_DATA["arch"], TrainConfig(**DEMO_TRAIN),
                         seed=0, progress=False)
    t_train = time.perf_counter() - t0
    r = args.restarts or max(1, min(8, round(args.seconds / 45)))
    recon = restarts(victim.attacker_view(), args.seconds, 0, [{}] * r)
    t_attack = time.perf_counter() - t0 - t_train
    res = exhume.evaluate(recon, victim, pool_size=1000, out=out / "evaluation")
    wall = time.perf_counter() - t0
    m = res.metrics
    row = {"memorised": m["memorised"], "control": m.get("memorised_control"), "one_to_one": m["one_to_one_ssim>=0.4"],
           "restarts": r, "iterations": recon.summary["iterations"], "train_s": round(t_train, 1),
           "attack_s": round(t_attack, 1), "total_wall_s": round(wall, 1), "threads": torch.get_num_threads(),
           "victim_epochs": victim.metrics.get("epochs")}
    (out / "demo_check.json").write_text(json.dumps(row, indent=1))
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
