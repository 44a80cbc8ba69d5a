"""The first layer's read (exhume/attacks/kkt/read.py): its margin and its reweighting swept on victims of ``exhume
experiment dp``'s two settings at ε = ∞, trained here at seeds the experiment does not use (its default is seed 0).

    python research/informed_read.py --seed 1 --targets 40 --margins 0.01,0.03,0.05,0.1,0.2 --reweights 0,10
    python research/informed_read.py --seed 2 --targets 40 --margins 0.01,0.03,0.05,0.1,0.2 --reweights 0,10
    python research/informed_read.py --seed 0 --targets 40 --settings paper --margins 0.03 --reweights 0 --why

``--why`` (EVALUATOR) prints, per target, the estimate's |cos| to the truth, the unweighted in-span system's smallest
eigenvalue over its largest, its objective at the estimate against at the truth's in-span part (best scale), and the
share of the truth's objective, on the half of the units where the target's term weighs most, in the tenth of them
that fit it worst (what the reweighting lets go of).

Each victim is trained once into ``runs/informed-read/<setting>_none_s<seed>/victim`` (the experiment's recipe,
public-mean centring); per margin and number of reweightings, the targets (the first ``--targets`` training records, each with the other 99
known) read and judged by the memorisation criterion (pool of 1,000 unseen, seed 5) and against one control each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import exhume.attacks.kkt.read as read
from exhume.evaluation.informed import reconstructed
from exhume.experiments.dp.cells import threat_of, victim_of
from exhume.experiments.dp.cli import NON_PRIVATE
from exhume.experiments.dp.informed import samples
from exhume.request import ThreatModel, view_of


def why(view, target: torch.Tensor, mean: torch.Tensor) -> str:
    """The in-span system the read solves, rebuilt here: its conditioning and its objective at the estimate and at the truth."""
    from exhume.equations.remainder import orthonormal

    seen = {}
    solve = read._in_span
    read._in_span = lambda wq, c, u, opened: seen.update(wq=wq, c=c, u=u, opened=opened) or solve(wq, c, u, opened)
    try:
        got = read.read_target(view, len(view.known) + 1)
    finally:
        read._in_span = solve
    if got.candidates is None:
        return got.why
    wq, c, u, opened = seen["wq"], seen["c"], seen["u"], seen["opened"]
    x = (view.known.x.double() - mean).reshape(len(view.known), -1)
    q = orthonormal(x)
    r = wq.shape[1]
    projs = []
    for j in range(wq.shape[0]):
        rows = c[opened[:, j]]
        qj = torch.linalg.qr(rows.T)[0] if rows.shape[0] else torch.zeros(r, 0, dtype=wq.dtype)
        projs.append(torch.eye(r, dtype=wq.dtype) - qj @ qj.T)
    a = sum(u[j] ** 2 * projs[j] for j in range(len(projs)))
    b = sum(u[j] * projs[j] @ wq[j] for j in range(len(projs)))
    d = torch.linalg.lstsq(a, b[:, None]).solution[:, 0]
    true = q.T @ (target.double().reshape(-1) - mean.reshape(-1))
    true = true * float(true @ b) / float(true @ a @ true)  # the truth's in-span part at its best scale

    def residuals(v):
        return torch.stack([((projs[j] @ (wq[j] - u[j] * v)) ** 2).sum() for j in range(len(projs))])

    def objective(v):
        return float(residuals(v).sum())

    at_truth = residuals(true)[u.abs() >= u.abs().median()].sort(descending=True).values  # units the target's term is in
    top = float(at_truth[:max(1, len(at_truth) // 10)].sum() / at_truth.sum())

    est = (got.candidates[0].double() - mean).reshape(-1)
    cos = abs(float(est @ (target.double() - mean).reshape(-1))) / float(est.norm() * (target.double() - mean).norm())
    vals = torch.linalg.eigvalsh(a)
    return (f"|cos| {cos:.3f}, eigenvalues min/max {float(vals[0] / vals[-1]):.1e}, objective {objective(d):.3e} at the "
            f"estimate, {objective(true):.3e} at the truth, {top:.2f} of the truth's in the worst tenth of the units its term weighs most in")


def sweep(setting: str, seed: int, targets: int, margins: list[float], reweights: list[int], explain: bool = False) -> None:
    folder = Path(f"runs/informed-read/{setting}_none_s{seed}/victim")
    victim = victim_of(setting, NON_PRIVATE, seed, {"n": 100, "epochs": None}, folder, True, False)
    train, pool, _, controls = samples(victim, {"targets": targets}, 0)
    arms = [(m, k) for k in reweights for m in margins]
    hits, matched = dict.fromkeys(arms, 0), dict.fromkeys(arms, 0)
    for t in range(targets):
        rest = [i for i in range(len(train)) if i != t]
        view = view_of(victim, ThreatModel(known_records=(train.x[rest], train.y[rest]), **threat_of(victim, setting)))
        for m, k in arms:
            read.MARGIN, read.REWEIGHTS = m, k
            got = read.read_target(view, len(train))
            if got.candidates is not None:
                hit = int(reconstructed(train.x[t:t + 1], got.candidates, pool.x)[0])
                hits[m, k] += hit
                matched[m, k] += int(reconstructed(controls.x[t:t + 1], got.candidates, pool.x)[0])
                if explain:
                    print(f"target {t} margin {m} reweights {k}: reconstructed {hit}; "
                          f"{why(view, train.x[t], view.mean.double())}", flush=True)
    for m, k in arms:
        print(f"{setting} seed {seed} margin {m} reweights {k}: reconstructed {hits[m, k]} of {targets}, "
              f"controls matched {matched[m, k]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", type=int, default=40)
    ap.add_argument("--settings", default="paper,minibatch")
    ap.add_argument("--margins", default="0.01,0.03,0.05,0.1,0.2")
    ap.add_argument("--reweights", default="0,10", help="the in-span least squares reweighted this many times (0: plain)")
    ap.add_argument("--why", action="store_true", help="per target: |cos|, the system's conditioning, its objective (EVALUATOR)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for setting in args.settings.split(","):
        sweep(setting, args.seed, args.targets, [float(m) for m in args.margins.split(",")],
              [int(k) for k in args.reweights.split(",")], args.why)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
