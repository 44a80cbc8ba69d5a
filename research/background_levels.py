"""Judge saved reconstructions again at several dark-floor levels τ (kkt's ``background``), and the control's floor.

    python research/background_levels.py --victims runs/z33/victims \\
        runs/z33/raw/mnist-256-haim__newpair__s0 runs/z33/raw/fashion-256-haim__newpair__s0 --taus 0 0.03 0.05 0.1
    python research/background_levels.py --victim runs/demo/victim runs/demo/attack --taus 0 0.03

Each reconstruction folder (its candidates as returned, e.g. by ``background=0`` or by the zoo's
``newpair`` method) is judged with :func:`exhume.evaluate` (1000 unseen pool images, the control on
held-out non-members) after :func:`exhume.attacks.priors.dark_floor` at each ``τ``, so the levels
differ by that output step alone (same optimisation, same iterations and seconds). The victim is
``--victim``, or ``--victims/<name>`` with the name read off the folder (``<victim>__<method>__s<seed>``).
``--concatenate-restarts`` judges a portfolio folder's restarts (``restarts/<k>/``) concatenated, as
``variant_screen.py`` pools them, instead of its merged reconstruction. ``--oracle`` adds the
control the training images themselves score as the candidates: what a perfect reconstruction of
every training image would leave in the control (evaluator-side, oracle). ``--quantiles q ...`` adds
a per-candidate level: each candidate's own ``q``-quantile of its clipped pixels, clamped to
``--quantile-range`` (default 0.03–0.15), so a candidate with more haze gets a higher floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import exhume
from exhume.attacks import load_reconstruction
from exhume.attacks.priors import dark_floor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled, restart_results  # noqa: E402  (the zoo's concatenation of restarts' candidates)


def per_candidate_floor(v: torch.Tensor, q: float, lo: float, hi: float) -> torch.Tensor:
    """``dark_floor`` with each candidate's own level: its ``q``-quantile of clipped pixels, clamped to [lo, hi]."""
    taus = v.clamp(0, 1).flatten(1).quantile(q, dim=1).clamp(lo, hi)
    return torch.stack([dark_floor(c, float(t)) for c, t in zip(v, taus)])


def judge(folder: Path, victim, taus: list[float], oracle: bool, concatenate: bool, quantiles=(), qrange=(0.03, 0.15)) -> list[str]:
    rec = pooled(restart_results(folder), "kkt", {}) if concatenate else load_reconstruction(folder)
    raw = rec.candidates.float()
    cells = []
    floors = [lambda v, t=t: dark_floor(v, t) for t in taus] + [lambda v, q=q: per_candidate_floor(v, q, *qrange) for q in quantiles]
    for floor in floors:
        rec.candidates = floor(raw)
        m = exhume.evaluate(rec, victim, pool_size=1000, figures=False).metrics
        cells.append(f"{m['memorised']} / {m['memorised_control']} ({m['one_to_one_ssim>=0.4']})")
    if oracle:
        task = victim.load_train_set()
        rec.candidates, rec.labels, rec.scores, rec.provenance = task.x.float(), task.y, None, {}
        cells.append(str(exhume.evaluate(rec, victim, pool_size=1000, figures=False).metrics["memorised_control"]))
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="reconstruction folders")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--victim", help="the victim folder of every reconstruction")
    where.add_argument("--victims", help="a folder of victims, named as the reconstructions' folders begin")
    ap.add_argument("--taus", nargs="+", type=float, default=[0.0, 0.03, 0.05, 0.1])
    ap.add_argument("--quantiles", nargs="*", type=float, default=[], help="per-candidate levels: each candidate's q-quantile")
    ap.add_argument("--quantile-range", nargs=2, type=float, default=[0.03, 0.15], help="clamp the per-candidate level")
    ap.add_argument("--oracle", action="store_true", help="add the control of the training images as the candidates")
    ap.add_argument("--concatenate-restarts", action="store_true", help="a portfolio folder's restarts, concatenated")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = [f"τ = {t:g}" for t in args.taus] + [f"τ = own {q:g}-quantile" for q in args.quantiles]
    head += (["control of the training images as candidates (oracle)"] if args.oracle else [])
    print("memorised / control (one-to-one SSIM >= 0.4)\n\n| reconstruction | " + " | ".join(head) + " |")
    print("|" + "---|" * (len(head) + 1))
    for f in map(Path, args.folders):
        victim_dir = args.victim or str(Path(args.victims) / f.name.split("__")[0])
        victim = exhume.load_victim(victim_dir)
        print(f"| {f.name} | " + " | ".join(judge(f, victim, args.taus, args.oracle, args.concatenate_restarts,
                                                                   args.quantiles, tuple(args.quantile_range))) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
