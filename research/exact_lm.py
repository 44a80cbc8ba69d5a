"""The exact training run's solvers side by side on tiny ReLU victims, at equal seconds (EVALUATOR-SIDE errors).

Each victim: an 8-16-1 ReLU MLP (float64) trained by a plain PyTorch loop on 4 points of 2×4 pixels (labels two of
each class, shuffled by the victim's seed), batches of 2 from a seeded shuffled DataLoader, 3 epochs of SGD with
momentum 0.9 and lr 0.1 (the victim of tests/test_exact_run.py::_tiny at seeds 0, 1, …). Solvers: ``lm`` (labels
given), ``adam`` with α = 10 and labels given, ``adam`` with the defaults (labels learnt). Error: per training point,
‖x̂ − x‖/‖x‖ after matching candidates to points one-to-one (Hungarian).

    python research/exact_lm.py --victims 0 1 2 3 --seconds 60
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def matched_errors(candidates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    got, truth = candidates.double().flatten(1) - 0.5, x.flatten(1)
    rel = torch.cdist(got, truth) / truth.norm(dim=1)
    rows, cols = linear_sum_assignment(rel.numpy())
    return rel[rows, cols]


def main(argv=None) -> int:
    from test_exact_run import _tiny

    from exhume.attacks import get_attack

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victims", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for seed in args.victims:
        view, x, y = _tiny(seed)
        given = ",".join(str(int(v)) for v in y)
        for name, kw in [("lm", {"solver": "lm", "labels": given, "init_scale": 0.1}),
                         ("adam α=10, labels given", {"alpha": 10.0, "labels": given, "init_scale": 0.1, "prior_weight": 0.0}),
                         ("adam, defaults", {})]:
            t = time.time()
            rec = get_attack("simulate", run="exact", iterations=10**6, max_seconds=args.seconds, dtype="float64", log_every=10,
                             **kw).run(view, progress=False)
            err = matched_errors(rec.candidates, x)
            print(f"victim {seed} | {name} | gap {rec.summary['final_relative_stationarity']:.2g} | iterations "
                  f"{rec.summary['iterations']} | {time.time() - t:.0f} s | matched errors {[round(float(e), 3) for e in err]}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
