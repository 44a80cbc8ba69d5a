"""Random features in the law's regime: the known-start attack, learned against closed-form multipliers.

The victim: a binary random-features model on MNIST, ``784 → width`` ReLU layer without biases frozen
at PyTorch's initialisation, a bias-free readout trained from its known start by full-batch
gradient descent on the logistic loss (``n`` bundled MNIST digits, label +1 for digits 0–4), so
only ``p = width`` parameters are trained and ``p/(d·n) = width/(784·n)``. The model is positively
homogeneous in its (centred) input, and what training added to the readout is exactly a
combination of the training digits' features: the known-start equation holds exactly.

Each variant runs exhume's kkt (``start_equation="auto"``: endpoints) at one seed on one core and
is judged by ``exhume.evaluate`` against the training digits and 1,000 unseen bundled digits
(pool and control), with the per-digit best SSIM (candidates clipped to [0, 1], as the evaluator
does) printed beside the counts, and judged again with ``candidate_scale="minmax"``. Budgets: equal seconds (``--seconds``) and equal iterations
(``--iterations``) for every variant, each in its own run.

    python research/random_features.py --n 5 --width 40000 --seconds 110 --iterations 1200 --out runs/law/rf5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import exhume
from exhume.data.datasets import load_bundled_mnist
from exhume.evaluation.ssim import ssim_matrix
from exhume.victim import AttackerView
from exhume.victim.random_features import train_random_features

VARIANTS = {
    "learned": {},  # today's default
    "closed-form": {"multipliers": "closed-form"},  # sphere off (its default)
    "closed-form-sphere": {"multipliers": "closed-form", "sphere": "on"},
    "closed-form-signed": {"multipliers": "closed-form", "start_multipliers": "signed"},
    "closed-form-lr3e-2": {"multipliers": "closed-form", "lr": 3e-2},
}


def victim(n: int, width: int, seed: int = 0, steps: int = 500, lr: float = 2.0):
    """The model (taking centred inputs), its start, the training digits, their ±1 labels, the data mean, unseen digits."""
    ds = load_bundled_mnist()
    images = torch.tensor(ds.images)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(images), generator=gen)
    train, unseen = images[order[:n]], images[order[n:n + 1000]]
    y = torch.where(torch.tensor(ds.labels)[order[:n]] < 5, 1.0, -1.0)
    mean = images.mean(0)
    model, start = train_random_features(train, y, mean, width, seed, steps=steps, lr=lr)
    with torch.no_grad():
        margins = y * model(train - mean)
    return model, start, train, y, mean, unseen, margins


def run_variant(view, train, y, unseen, settings: dict, budget: dict) -> dict:
    t0 = time.perf_counter()
    recon = exhume.get_attack("kkt", **settings, **budget).run(view, progress=False)
    wall = time.perf_counter() - t0
    ev = exhume.evaluate(recon, train=(train, y), unseen=unseen, figures=False)
    best = ssim_matrix(train, recon.candidates.clamp(0, 1)).max(1).values
    m, mm = ev.metrics, exhume.evaluate(recon, train=(train, y), unseen=unseen, figures=False, candidate_scale="minmax").metrics
    return {"iterations": recon.summary["iterations"], "seconds": recon.summary["seconds"], "wall_seconds": round(wall, 1),
            "final_relative_residual": recon.summary["final_relative_stationarity"], "memorised": m["memorised"],
            "memorised_control": m["memorised_control"], "verdict": m["verdict"],
            "one_to_one_ssim_mean": m["one_to_one_ssim_mean"], "best_ssim": [round(float(v), 3) for v in best],
            "minmax": {"memorised": mm["memorised"], "memorised_control": mm["memorised_control"], "verdict": mm["verdict"],
                       "one_to_one_ssim_mean": mm["one_to_one_ssim_mean"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--width", type=int, default=40_000)
    ap.add_argument("--seconds", type=float, default=110.0, help="the equal-seconds budget")
    ap.add_argument("--iterations", type=int, default=1200, help="the equal-iterations budget")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--budgets", default="seconds,iterations")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, start, train, y, mean, unseen, margins = victim(args.n, args.width)
    view = AttackerView(model=model, task="binary", input_shape=(1, 28, 28), mean=mean, start=start, loss="logistic",
                        n_train_hint=args.n)
    ratio = args.width / (784 * args.n)
    print(f"n={args.n} width={args.width} p/(d·n)={ratio:.2f} training margins {margins.numpy().round(2)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for budget_name in args.budgets.split(","):
        budget = ({"max_seconds": args.seconds, "iterations": 10**6} if budget_name == "seconds"
                  else {"iterations": args.iterations})
        for name in args.variants.split(","):
            row = {"variant": name, "budget": budget_name, **run_variant(view, train, y, unseen, VARIANTS[name], budget)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "results.json").write_text(json.dumps({"n": args.n, "width": args.width, "p_over_dn": ratio,
                                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
