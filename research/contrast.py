"""The candidates' contrast: how far from the data mean should the returned images be?

    python research/contrast.py runs/scr/*/default --zoo runs/zoo/victims

For a network that is positively homogeneous in its input (bias-free ReLU layers) the stationarity
equation holds for ``(λ/c, mean + c·(x̂ − mean))`` as well as for ``(λ, x̂)``: only the priors and
the multipliers' scale pin ``c``. This re-scores saved kkt portfolios (``variant_screen.py``
folders, ``restarts/<k>/``; the victim is ``--zoo/<name>`` where ``<name>`` is the folder above
the portfolio's) with every candidate's departure from the data mean multiplied by ``c`` (then
clipped to the pixel range, as the evaluator does anyway), by rules an attacker can apply:

- ``c = 1.25, 1.5, 2``: one factor for every candidate;
- ``stretch``: per candidate, the largest ``c`` in [1, 4] at which at most 2 % of its pixels leave
  the pixel range (the image is stretched until it fills the range, as a training image does);
  ``stretch-hi``: the same counting only the pixels pushed above 1;
- ``consistent`` (victims with weight decay): per candidate, the ``c`` at which its multiplier
  ``λ/c`` and its margin satisfy ``λ = σ(−margin)/(n·w)``, the relation every training point
  satisfies (Buzaglo et al.).

Each pool (candidates concatenated, not merged) is scored with ``exhume.evaluate`` (1000 unseen
images, the control on held-out non-members): the rescaled candidates alone, and added to the
original ones. Evaluator-side: reads the training set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import exhume
from exhume.attacks.base import Reconstruction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402

STRETCH_OUTSIDE = 0.02
STRETCH_MAX = 4.0


def stretch_factors(x: torch.Tensor, mean: torch.Tensor, outside: float = STRETCH_OUTSIDE,
                    c_max: float = STRETCH_MAX, upper_only: bool = False) -> torch.Tensor:
    """Per candidate, the largest c in [1, c_max] with at most ``outside`` of its pixels out of [0, 1]
    (``upper_only``: above 1; pixels pushed below 0 are clipped, as a dark background is)."""
    d = (x - mean).reshape(x.shape[0], -1)
    mu = mean.expand_as(x).reshape(x.shape[0], -1)
    inf = torch.full_like(d, float("inf"))
    below = inf if upper_only else torch.where(d < 0, mu / (-d).clamp_min(1e-12), inf)
    hit = torch.where(d > 0, (1 - mu) / d.clamp_min(1e-12), below)
    c = torch.quantile(hit.clamp_max(1e6), outside, dim=1)
    return c.clamp(1.0, c_max)


def consistent_factors(view, rec: Reconstruction, grid: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per candidate, the c on a log grid in [0.5, 4] that best satisfies ``λ_j/c = σ(−margin_j(c))/(n·w)``.

    ``margin_j(c)`` is the network's margin at ``mean + c·(x̂_j − mean)`` (exact forward pass),
    ``λ_j`` the candidate's multiplier (kkt's score), ``n`` the attack's guess, ``w`` the weight
    decay: Buzaglo et al.'s relation at a training point. None without weight decay or multipliers.
    """
    from exhume.losses import margin

    wd = rec.config.get("weight_decay_assumed") or 0.0
    if wd <= 0 or rec.scores is None or rec.config.get("formulation") != "margin":
        return None
    grid = torch.logspace(-0.30103, 0.60206, 37) if grid is None else grid
    n_w = float(rec.config.get("n_guess") or 100) * wd
    x = rec.candidates.float() - view.mean.float()
    lam = rec.scores.float().clamp_min(1e-30)
    y = rec.labels
    model = view.model.float().eval()
    err = []
    with torch.no_grad():
        for c in grid.tolist():
            h = margin(model(c * x), y)
            err.append((torch.log(lam * n_w / c) + torch.nn.functional.softplus(h)) ** 2)
    return grid[torch.stack(err).argmin(0)]


def rescaled(rec: Reconstruction, mean: torch.Tensor, c) -> Reconstruction:
    x = rec.candidates.float()
    c = torch.as_tensor(c, dtype=x.dtype)
    if c.ndim == 1:
        c = c.reshape(-1, *([1] * (x.ndim - 1)))
    v = (mean + c * (x - mean)).clamp(0, 1)
    return Reconstruction(method=rec.method, candidates=v, labels=rec.labels, scores=rec.scores, config=rec.config,
                          seed=rec.seed, summary=rec.summary)


def both(a: Reconstruction, b: Reconstruction) -> Reconstruction:
    """``a``'s candidates and ``b``'s, concatenated (the zoo's pooling)."""
    return pooled([a, b], a.method, {})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="kkt portfolio folders (restarts/<k>/), one per victim")
    ap.add_argument("--zoo", required=True, help="folder of the victims, by name")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| victim | candidates | c = 1 | c = 1.25 | c = 1.5 | c = 2 | stretch (median c) | stretch-hi (median c) "
          "| consistent (median c) | 1 + 1.5 | 1 + stretch-hi |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        name = Path(run).parent.name
        victim = exhume.load_victim(Path(args.zoo) / name)
        mean = victim.attacker_view().mean.float()
        base = pooled(restart_results(run), "kkt", {})

        def score(rec: Reconstruction, victim=victim) -> str:
            m = exhume.evaluate(rec, victim, pool_size=1000, figures=False).metrics
            return f"{m['memorised']} / {m['memorised_control']} ({m['one_to_one_ssim>=0.4']})"

        cs = stretch_factors(base.candidates.float(), mean)
        ch = stretch_factors(base.candidates.float(), mean, upper_only=True)
        cc = consistent_factors(victim.attacker_view(), base)
        cells = [score(base), *(score(rescaled(base, mean, c)) for c in (1.25, 1.5, 2.0)),
                 f"{score(rescaled(base, mean, cs))} ({float(cs.median()):.2f})",
                 f"{score(rescaled(base, mean, ch))} ({float(ch.median()):.2f})",
                 "–" if cc is None else f"{score(rescaled(base, mean, cc))} ({float(cc.median()):.2f})",
                 score(both(base, rescaled(base, mean, 1.5))), score(both(base, rescaled(base, mean, ch)))]
        print(f"| {name} | {base.candidates.shape[0]} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
