"""What a portfolio's pool misses, and three ways of going after it (evaluator-side: reads the training set).

    python research/after_pool.py bands  --victim V --run R
    python research/after_pool.py warm   --victim V --run R --out O [--wave 0 1] [--tau 0.8]
    python research/after_pool.py polish --victim V --run R --out O [--top 200] [--iterations 1000] [--lr 2e-3]
    python research/after_pool.py blur   --victim V --run R [--sigma 0.5 0.7 1.0]

``R`` is a kkt portfolio folder with ``restarts/<k>/`` (``variant_screen.py`` writes them, restart k
with seed ``seed + k`` and the portfolio's variants ``[{}, {"lr_lambda": 1e-4}][k % 2]``). Every
pool is the restarts' candidates concatenated (as in ``variant_screen.py``) and scored by
``exhume.evaluate`` (1000 unseen images, the control on held-out non-members).

- ``bands``: the training points grouped by their multiplier ``λ_i = σ(−margin_i)/(n·w)`` relative to
  the attack's scale ``S`` (``u = λ/S`` is what kkt optimises, with the floor ``λ_min``; binary
  victims with weight decay) or, without weight decay, by margin; per band how many the pool
  memorised, and the SSIM of each training image's best candidate against its best unseen image.
- ``warm``: restarts ``2, 3`` (the same seeds and variants as the run's own) started from the
  *consensus* of restarts ``wave``: candidates of the first whose best same-label match in the
  second correlates (NCC of the mean-subtracted images) above ``tau``, each pair averaged, near
  duplicates (NCC > 0.9) dropped, placed in label-matching slots of ``m`` candidates, the other
  slots kkt's noise. Attacker-side: it reads its own earlier candidates only. Scored with the
  wave's restarts against the run's own four.
- ``polish``: one kkt run started from the pool's ``top`` candidates by the portfolio's
  attacker-side rank after the portfolio's merge (:mod:`exhume.portfolio.pool`), all at once.
- ``blur``: the pool's candidates smoothed by a 5×5 Gaussian of each ``sigma``, alone and added.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import exhume

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402
from exhume.attacks import Reconstruction, load_reconstruction  # noqa: E402
from exhume.attacks.formulation import candidate_labels  # noqa: E402
from exhume.attacks.kkt import KKTAttack  # noqa: E402
from exhume.evaluation.matching import ncc_matrix  # noqa: E402
from exhume.evaluation.run import margins_of  # noqa: E402
from exhume.portfolio.pool import near_duplicates, rank_scores  # noqa: E402

VARIANTS = [{}, {"lr_lambda": 1e-4}]


def score(recon: Reconstruction, victim) -> str:
    m = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
    return f"memorised {m['memorised']} / control {m['memorised_control']} (one-to-one {m['one_to_one_ssim>=0.4']})"


def with_candidates(recon: Reconstruction, candidates: torch.Tensor, labels: torch.Tensor | None = None) -> Reconstruction:
    out = copy.copy(recon)
    out.candidates = candidates
    if labels is not None:
        out.labels = labels
        out.scores = None
    return out


def bands(victim, rs) -> None:
    result = exhume.evaluate(pooled(rs, "kkt", {}), victim, pool_size=1000, figures=False)
    mem = np.asarray(result.arrays["memorised"]).astype(bool)
    best, unseen = np.asarray(result.arrays["ssim"]), np.asarray(result.arrays["pool_ssim"])
    train = victim.load_train_set()
    margins = margins_of(victim.model.float().eval(), train.centred.float(), train.y, victim.task, victim.loss)[0]
    wd, n = float(victim.weight_decay or 0.0), len(margins)
    if wd > 0 and victim.task == "binary":
        s = rs[0].config["lambda_scale_value"]
        key, name = 1.0 / (1.0 + np.exp(margins)) / (n * wd) / s, "λ/S"
        edges = [0.0, 0.1, 0.2, 0.42, 1.0, np.inf]
    else:
        key, name = margins, "margin"
        edges = list(np.quantile(margins, [0, 0.25, 0.5, 0.75])) + [np.inf]
    print(f"memorised {mem.sum()} of {n} (control {result.metrics['memorised_control']})\n")
    print(f"| {name} | points | memorised | margins | best candidate SSIM (median) | best unseen SSIM (median) |\n|---|---|---|---|---|---|")
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (key >= lo) & (key < hi)
        if sel.any():
            print(f"| [{lo:.3g}, {hi:.3g}) | {sel.sum()} | {mem[sel].sum()} | {margins[sel].min():.2f}–{margins[sel].max():.2f} | "
                  f"{np.median(best[sel]):.2f} | {np.median(unseen[sel]):.2f} |")


def consensus(a: Reconstruction, b: Reconstruction, mean: torch.Tensor, tau: float):
    def centred(c):
        return c.float().clamp(0, 1) - mean.float().clamp(0, 1).reshape(1, *c.shape[1:])

    sim = ncc_matrix(centred(a.candidates), centred(b.candidates))
    sim = torch.where(a.labels.reshape(-1, 1) == b.labels.reshape(1, -1), sim, torch.full_like(sim, -1.0))
    best, j = sim.max(1)
    keep = torch.nonzero(best > tau).flatten()
    imgs, labs = 0.5 * (a.candidates[keep] + b.candidates[j[keep]]), a.labels[keep]
    kept, _ = near_duplicates(imgs, labs, torch.argsort(-best[keep]), 0.9, mean=mean)
    return imgs[kept], labs[kept]


def slotted(view, images: torch.Tensor, labels: torch.Tensor, m: int, seed: int) -> tuple[torch.Tensor, int]:
    """``m`` display-space starting candidates: ``images`` in slots of their label, kkt's noise elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    noise = KKTAttack.params["init_scale"].default  # kkt's own starting noise
    init = view.mean.reshape(1, *view.input_shape) + torch.randn(m, *view.input_shape, generator=gen) * noise
    slots = candidate_labels(view.task, m, view.num_classes, torch.float32)
    used = torch.zeros(m, dtype=torch.bool)
    for img, lab in zip(images, labels):
        free = torch.nonzero((slots == lab) & ~used).flatten()
        if free.numel():
            used[free[0]] = True
            init[free[0]] = img
    return init, int(used.sum())


def run_from(victim, init: torch.Tensor, name: str, out: Path, seed: int, iterations: int, **params) -> Reconstruction:
    if (out / "reconstruction.json").exists():
        return load_reconstruction(out)
    return exhume.attack(victim, "kkt", restarts=1, init=init, init_name=name, iterations=iterations, seed=seed,
                         progress=False, out=out, resume=out.is_dir(), **params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=("bands", "warm", "polish", "blur"))
    ap.add_argument("--victim", required=True)
    ap.add_argument("--run", required=True, help="a kkt portfolio folder with restarts/<k>/")
    ap.add_argument("--out", help="folder for the runs warm and polish start")
    ap.add_argument("--wave", type=int, nargs=2, default=[0, 1])
    ap.add_argument("--tau", type=float, default=0.8)
    ap.add_argument("--top", type=int, default=200)
    ap.add_argument("--iterations", type=int, default=None, help="default: the run's own (warm), 1000 (polish)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--sigma", type=float, nargs="+", default=[0.5, 0.7, 1.0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.cmd in ("warm", "polish") and not args.out:
        raise SystemExit(f"{args.cmd}: --out is required")
    torch.set_num_threads(args.threads)
    victim = exhume.load_victim(args.victim)
    view = victim.attacker_view()
    rs = restart_results(args.run)
    if args.cmd == "bands":
        bands(victim, rs)
        return 0
    if args.cmd == "blur":
        base = pooled(rs, "kkt", {})
        print(f"pool: {score(base, victim)}")
        for s in args.sigma:
            k = torch.arange(-2, 3, dtype=torch.float32)
            g = torch.exp(-k**2 / (2 * s * s))
            g = g / g.sum()
            c = base.candidates.shape[1]
            blurred = F.conv2d(F.pad(base.candidates.float(), (2, 2, 2, 2), mode="replicate"),
                               (g[:, None] * g[None, :]).expand(c, 1, 5, 5), groups=c)
            print(f"sigma {s:g}: blurred {score(with_candidates(base, blurred), victim)}; "
                  f"added {score(pooled([base, with_candidates(base, blurred)], 'kkt', {}), victim)}")
        return 0
    out = Path(args.out)
    if args.cmd == "warm":
        images, labels = consensus(rs[args.wave[0]], rs[args.wave[1]], view.mean, args.tau)
        m = rs[0].candidates.shape[0]
        its = args.iterations or int(rs[0].summary["iterations"])
        later = []
        for k in (2, 3):
            seed = rs[k].seed
            init, placed = slotted(view, images, labels, m, seed + 1000)
            later.append(run_from(victim, init, "consensus", out / str(k), seed, its, **VARIANTS[k % 2]))
        print(f"{images.shape[0]} consensus candidates of restarts {args.wave}, {placed} placed; restarts 2, 3 from them "
              f"({its} iterations each, seeds {[r.seed for r in later]})")
        print(f"run's own 4 restarts: {score(pooled(rs, 'kkt', {}), victim)}")
        print(f"restarts {args.wave} + warm-started 2, 3: {score(pooled([rs[i] for i in args.wave] + later, 'kkt', {}), victim)}")
        print(f"restarts {args.wave} alone: {score(pooled([rs[i] for i in args.wave], 'kkt', {}), victim)}")
        print(f"warm-started 2, 3 alone: {score(pooled(later, 'kkt', {}), victim)}; "
              f"the run's own 2, 3: {score(pooled(rs[2:4], 'kkt', {}), victim)}")
        return 0
    base = pooled(rs, "kkt", {})
    rank = torch.cat([rank_scores(view, r) for r in rs])
    kept, _ = near_duplicates(base.candidates, base.labels, torch.argsort(-rank, stable=True), mean=view.mean)
    kept = kept[: args.top]
    images, labels = base.candidates[kept], base.labels[kept]
    classes = view.num_classes if view.task == "multiclass" else 2
    m = classes * max(int((labels == v).sum()) for v in labels.unique())
    init, placed = slotted(view, images, labels, m, 1000)
    polished = run_from(victim, init, "pool", out, 99, args.iterations or 1000, lr=args.lr)
    print(f"top {placed} of {len(kept)} ranked candidates after the merge, m = {m}, {polished.summary['iterations']} iterations "
          f"at lr {args.lr:g} in {polished.summary['seconds']:.0f} s")
    print(f"the pool: {score(base, victim)}")
    print(f"its top {len(kept)}: {score(with_candidates(base, images, labels), victim)}")
    print(f"polished: {score(polished, victim)}; pool + polished: {score(pooled(rs + [polished], 'kkt', {}), victim)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
