"""Restart iterations per second: the portfolio's worker processes beside its batched path, side by side on CPU.

Each victim (MNIST odd/even, trained briefly: the weights' values change no timing) is attacked by one
kkt portfolio of ``--restarts`` restarts at ``--iterations`` iterations each, two ways, alternating in
``--rounds`` rounds so that a change of load hits both alike:

* ``workers``: ``batch_restarts="off"``, ``workers = --restarts`` forked one-thread processes (today's CPU path);
* ``batched``: ``batch_restarts="on"``, one process with ``--restarts`` torch threads
  (:mod:`exhume.portfolio.batched`);
* ``batched-1t``: the same with one torch thread (one core: compare per core with ``workers``).

On a machine whose cores other jobs load, torch's threads wait on each other (a two-thread step measured
5-10x slower than a one-thread one at a load of 10 on 2 cores): read ``batched`` there with care.

Reported: wall seconds of the whole portfolio call (set-up, pooling included), restart iterations per
second (``restarts × iterations / wall``) and CPU milliseconds per restart iteration (this process and its
reaped workers; steadier than wall time on a loaded machine), median over rounds; and the largest difference between the two
paths' pooled candidates (they must agree: same seeds, equal iterations).

    nice -n 10 python benchmarks/bench_batched.py --json runs/batched/bench_batched.json
    python benchmarks/bench_batched.py --device cuda --restarts 8 --iterations 500 --arms workers batched   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from exhume.portfolio import run_portfolio  # noqa: E402
from exhume.victim import TrainConfig, make_victim  # noqa: E402

VICTIMS = {  # name: (arch, n): candidates m = 2n
    "mlp-256-256": ("mlp:256,256;bias=none;init=1e-4", 100),
    "mlp-1000-1000": ("mlp:1000,1000;bias=none;init=1e-4", 50),
    "cnn-16-fc256": ("cnn:16;fc=256;pool=avg", 50),
}


ARMS = ("workers", "batched", "batched-1t")


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped children (the forked workers) so far."""
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def one(view, arm: str, restarts: int, iterations: int, device: str = "cpu") -> tuple[float, float, torch.Tensor]:
    torch.set_num_threads(restarts if arm == "batched" else 1)
    t0, c0 = time.perf_counter(), cpu_seconds()
    r = run_portfolio(view, restarts=restarts, workers=restarts, progress=False, batch_restarts="off" if arm == "workers" else "on",
                      iterations=iterations, checkpoint_every=10**9, device=device)
    return time.perf_counter() - t0, cpu_seconds() - c0, r.candidates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victims", nargs="+", default=list(VICTIMS), choices=list(VICTIMS))
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--device", default="cpu", help="torch device (on cuda the workers are spawned, one CUDA context each)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for name in args.victims:
        arch, n = VICTIMS[name]
        torch.set_num_threads(1)
        victim = make_victim("mnist", "odd-even", n, arch, TrainConfig(loss="logistic", optimizer="gd", lr=0.2, weight_decay=5e-3,
                                                                        max_epochs=50), seed=0, progress=False, test_size=10)
        view = victim.attacker_view()
        walls = {arm: [] for arm in args.arms}
        cpus = {arm: [] for arm in args.arms}
        diff = 0.0
        for _ in range(args.rounds):
            got = {}
            for arm in args.arms:
                wall, cpu, cands = one(view, arm, args.restarts, args.iterations, args.device)
                walls[arm].append(wall)
                cpus[arm].append(cpu)
                got[arm] = cands
            diff = max([diff] + [float((got[args.arms[0]] - c).abs().max()) for c in got.values()])
        row = {"victim": name, "arch": arch, "m": 2 * n, "restarts": args.restarts, "iterations": args.iterations,
               "max_candidate_difference": diff}
        for arm, w in walls.items():
            row[f"{arm}_wall_s"] = round(statistics.median(w), 2)
            row[f"{arm}_restart_it_per_s"] = round(args.restarts * args.iterations / statistics.median(w), 1)
            row[f"{arm}_cpu_ms_per_restart_it"] = round(1000 * statistics.median(cpus[arm]) / (args.restarts * args.iterations), 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "rounds": args.rounds,
            "device": args.device, "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("| victim | m | restarts × iterations | "
          + " | ".join(f"{a}: wall s | {a}: restart it/s | {a}: CPU ms per restart it" for a in args.arms) + " |")
    print("|---|---|---|" + "---|---|---|" * len(args.arms))
    for r in rows:
        print(f"| {r['victim']} | {r['m']} | {r['restarts']} × {r['iterations']} | "
              + " | ".join(f"{r[a + '_wall_s']} | {r[a + '_restart_it_per_s']} | {r[a + '_cpu_ms_per_restart_it']}" for a in args.arms)
              + " |")


if __name__ == "__main__":
    main()
