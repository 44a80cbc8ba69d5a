"""Deflation: hold the candidates a portfolio agrees on fixed, and attack only the part of θ they leave.

    python research/deflation.py --run runs/cw30/attack --victim runs/demo-victim --out runs/defl \\
        --first 16 --more 8 --iterations 3000 --min-share 0.5 -p consistency_weight=1e-3

Phase 1 is an existing portfolio run (``--run``; its first ``--first`` restarts). Its candidates are
merged as the portfolio merges them (same label, NCC of the clipped images less the data mean above
``--ncc``, 0.7 here against the portfolio's 0.95: two restarts' versions of one digit rarely
correlate above 0.95; best-ranked first); a merged group found by at least ``--min-share`` of those restarts is held
fixed. Their multipliers are fitted by non-negative least squares on ``θ`` (exact ReLU derivative),
and ``--more`` new kkt restarts (seeds 1000 + k, the default portfolio's alternation of ``lr_lambda``)
attack ``θ − Σ_f λ_f ∇_θ h_f`` with ``--iterations`` iterations each. Equal-budget comparison: the
first ``--first`` + ``--more`` restarts of the phase-1 run itself (if it has that many), scored the
same way (candidates concatenated, ``exhume.evaluate``, 1000 unseen pool images, control on held-out
non-members). Evaluator-side: reads the training set. The attack itself is attacker-side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

import exhume
from exhume.attacks import get_attack, load_reconstruction
from exhume.portfolio.pool import near_duplicates, rank_scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402


def agreed(view, recons: list, min_share: float, ncc: float = 0.8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The merged groups found by at least ``min_share`` of ``recons``: (candidates, labels, restarts found in)."""
    cands = torch.cat([r.candidates.float() for r in recons])
    labels = torch.cat([r.labels for r in recons])
    restart = torch.cat([torch.full((r.candidates.shape[0],), k) for k, r in enumerate(recons)])
    rank = torch.cat([rank_scores(view, r) for r in recons])
    kept, owner = near_duplicates(cands, labels, torch.argsort(-rank, stable=True), ncc, mean=view.mean)
    members = torch.zeros(cands.shape[0], len(recons), dtype=torch.bool)  # as exhume.portfolio.pool counts them
    members[owner, restart] = True
    found = members[kept].sum(1)
    pick = found >= min_share * len(recons)
    return cands[kept[pick]], labels[kept[pick]], found[pick]


def why(victim, fx: torch.Tensor, fy: torch.Tensor) -> None:
    """Evaluator-side: the share of ‖θ‖² that the training points, the fixed images and mixtures explain (NNLS)."""
    from exhume.attacks.base import attack_model
    from exhume.attacks.formulation import resolve
    from exhume.attacks.stationarity import fixed_part
    from exhume.evaluation.ssim import ssim_matrix

    view = victim.attacker_view()
    model, params = attack_model(view.model, torch.device("cpu"), torch.float64)
    form = resolve(view, model, "auto", None, None, "auto", params, 100, 200, torch.float64)
    mean = view.mean.double()
    ts = victim.train_set
    x, y = ts.x.double(), ts.y.double()

    def share(xs, ys) -> float:
        return fixed_part(model, params, xs - mean, ys, form.objective, form.signed)[2]

    best = ssim_matrix(ts.x.float().clamp(0, 1), fx.float().clamp(0, 1)).max(0)
    hit = best.indices[best.values >= 0.4].unique()
    miss = torch.tensor(sorted(set(range(x.shape[0])) - set(hit.tolist())), dtype=torch.long)
    print(f"share of ||theta||^2 explained (NNLS): the {x.shape[0]} training points {share(x, y):.3f}; the {hit.numel()} "
          f"they match (SSIM >= 0.4) {share(x[hit], y[hit]):.3f}; the {fx.shape[0]} fixed images {share(fx.double(), fy.double()):.3f}; "
          f"fixed images + the {miss.numel()} training points they miss "
          f"{share(torch.cat([fx.double(), x[miss]]), torch.cat([fy.double(), y[miss]])):.3f}", flush=True)


def one_restart(args) -> str:
    victim_dir, folder, seed, config, fixed_path = args
    torch.set_num_threads(1)
    if (Path(folder) / "reconstruction.json").exists():
        return folder
    view = exhume.load_victim(victim_dir).attacker_view()
    fixed = torch.load(fixed_path, weights_only=True) if fixed_path else None
    rec = get_attack("kkt", **config).run(view, seed=seed, progress=False,
                                          fixed=None if fixed is None else (fixed["x"], fixed["y"]))
    rec.save(folder)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--victim", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--first", type=int, default=16)
    ap.add_argument("--more", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--min-share", type=float, default=0.5)
    ap.add_argument("--ncc", type=float, default=0.7, help="merge threshold for counting agreement")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--plain", action="store_true", help="also run --more plain restarts (seeds 1000 + k) as the control arm")
    ap.add_argument("-p", action="append", default=[], help="kkt setting k=v for phase 2 (JSON value)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    victim = exhume.load_victim(args.victim)
    view = victim.attacker_view()
    recons = restart_results(args.run)
    phase1 = recons[:args.first]
    t0 = time.perf_counter()
    fx, fy, found = agreed(view, phase1, args.min_share, args.ncc)
    print(f"held fixed: {fx.shape[0]} merged candidates found by >= {args.min_share:g} of {len(phase1)} restarts "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    why(victim, fx, fy)
    fixed_path = out / "fixed.pt"
    torch.save({"x": fx, "y": fy}, fixed_path)
    base = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.p)}
    base.update(iterations=args.iterations, max_seconds=None)
    jobs = []
    for k in range(args.more):
        cfg = {**base, **({"lr_lambda": 1e-4} if k % 2 else {})}
        jobs.append((args.victim, str(out / "deflated" / str(k)), 1000 + k, cfg, str(fixed_path)))
        if args.plain:
            jobs.append((args.victim, str(out / "plain" / str(k)), 1000 + k, cfg, None))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as ex:
        for f in ex.map(one_restart, jobs):
            r = load_reconstruction(f)
            print(f"{f}: {r.summary['iterations']} it, {r.summary['seconds']:.0f} s, "
                  f"stationarity {r.summary['final_relative_stationarity']:.3g}, "
                  f"share fixed {r.config.get('fixed_share_explained', '-')}", flush=True)
    print(f"phase 2: {time.perf_counter() - t0:.0f} s", flush=True)
    deflated = [load_reconstruction(j[1]) for j in jobs if "/deflated/" in j[1]]

    def row(label, rs):
        m = exhume.evaluate(pooled(rs, "kkt-restarts", {}), victim, pool_size=1000, figures=False).metrics
        print(f"| {label} | {len(rs)} | {m['memorised']} | {m['memorised_control']} | {m['one_to_one_ssim>=0.4']} |", flush=True)

    print("\n| pool | restarts | memorised | control | one-to-one SSIM ≥ 0.4 |\n|---|---|---|---|---|")
    row(f"phase 1: first {args.first}", phase1)
    row("phase 2 deflated alone", deflated)
    row(f"first {args.first} + {args.more} deflated", phase1 + deflated)
    if args.plain:
        plain = [load_reconstruction(j[1]) for j in jobs if "/plain/" in j[1]]
        row("phase 2 plain alone", plain)
        row(f"first {args.first} + {args.more} plain (seeds 1000+)", phase1 + plain)
    if len(recons) >= args.first + args.more:
        row(f"first {args.first + args.more} of the run", recons[:args.first + args.more])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
