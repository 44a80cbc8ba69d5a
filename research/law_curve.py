"""The law of data reconstruction on small random-features models: what the known-start attack recovers against p/(d·n).

Random-features victims on sklearn's 8×8 digits (d = 64): a ``64 → width`` ReLU layer without biases
frozen at PyTorch's initialisation, a bias-free readout trained from its known start (full-batch
gradient descent, logistic loss, digits 0 against 1), ``n`` training digits, so ``p/(d·n) =
width/(64·n)``. For each ratio and seed, exhume's kkt with the start known, learned and closed-form
multipliers at equal iterations, judged by ``exhume.evaluate`` against the training digits with the
other 0s and 1s as pool and control: the memorised fraction and the one-to-one SSIM.

    python research/law_curve.py --out runs/law/law --n 8 --ratios 0.25,0.5,1,2,4,8,16 --seeds 0,1 \
        --figure docs/figures/law-random-features.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits

import exhume
from exhume.victim import AttackerView
from exhume.victim.random_features import train_random_features

VARIANTS = {"learned": {}, "closed-form": {"multipliers": "closed-form", "lr": 3e-2}}


def victim(n: int, width: int, seed: int):
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target)
    gen = torch.Generator().manual_seed(seed)
    keep = torch.where(labels <= 1)[0]
    keep = keep[torch.randperm(len(keep), generator=gen)]
    train, unseen = x[keep[:n]], x[keep[n:]]
    y, mean = torch.where(labels[keep[:n]] == 0, 1.0, -1.0), x.mean(0)
    model, start = train_random_features(train, y, mean, width, seed)
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, start=start, loss="logistic", n_train_hint=n)
    return view, train, y, unseen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--ratios", default="0.25,0.5,1,2,4,8,16")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--figure", type=Path, default=None, help="also write the figure here (e.g. docs/figures/law-random-features.png)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for ratio in (float(r) for r in args.ratios.split(",")):
        width = max(1, round(ratio * 64 * args.n))
        for seed in (int(s) for s in args.seeds.split(",")):
            view, train, y, unseen = victim(args.n, width, seed)
            for name, settings in VARIANTS.items():
                t0 = time.perf_counter()
                recon = exhume.get_attack("kkt", iterations=args.iterations, **settings).run(view, progress=False, seed=seed)
                secs = time.perf_counter() - t0
                row = {"ratio": ratio, "width": width, "seed": seed, "variant": name, "seconds": round(secs, 1),
                       "iterations": recon.summary["iterations"], "residual": recon.summary["final_relative_stationarity"]}
                for scale in ("clip", "minmax"):
                    m = exhume.evaluate(recon, train=(train, y), unseen=unseen, figures=False, candidate_scale=scale).metrics
                    row[scale] = {"memorised": m["memorised"], "control": m["memorised_control"],
                                  "one_to_one_ssim_mean": round(m["one_to_one_ssim_mean"], 3)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "results.json").write_text(json.dumps({"n": args.n, "rows": rows}, indent=1))
    if args.figure is not None:
        figure(args.out / "results.json", args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def figure(results: Path, out: Path) -> None:
    """Memorised fraction against p/(d·n) (log x), one line per variant, from a ``results.json`` of :func:`main`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text())
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name in VARIANTS:
        rows = [r for r in data["rows"] if r["variant"] == name]
        ratios = sorted({r["ratio"] for r in rows})
        frac = [sum(r["clip"]["memorised"] for r in rows if r["ratio"] == q) / (data["n"] * sum(r["ratio"] == q for r in rows))
                for q in ratios]
        ax.plot(ratios, frac, marker="o", label=f"{name} multipliers")
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", xlabel="p/(d·n)", ylabel="memorised fraction", ylim=(0, 1),
           title=f"random features, sklearn digits, n = {data['n']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
