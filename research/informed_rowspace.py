"""The informed adversary's exact algebra on a victim centred by a public mean: the first layer off the known span.

    python research/informed_rowspace.py VICTIM [--targets 100]              # the first layer off the known span
    python research/informed_rowspace.py VICTIM --deflate                     # minus the known records' exact terms

With the inputs centred by a public mean, every update of the first layer is a sum of matrices ``a·x_iᵀ`` of the
fixed centred inputs, so ``W₁ = W₁,₀ + A·Xᵀ``; projected off the span of the n − 1 known centred records,
``W₁·P⊥`` is ``W₁,₀·P⊥ + a_t·(P⊥x_t)ᵀ``: rank one but for the initialisation's part (small in the demo's victim),
its top right singular vector the target's part outside the known span. The candidate: the known records' least
squares part of the target is unknown; this reads the out-of-span part (both signs, scaled to the data's range)
plus the public mean, and judges it by the memorisation criterion (1,000 unseen images). ``--deflate``: the
first layer minus the known records' terms at a stationary point, ``(1/(n·w))·∇_{W₁}(−ℓ_k)`` (the whole target,
in and out of the span, if the victim were exactly stationary), read the same way.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from exhume.data import load_dataset
from exhume.data.tasks import select_pool
from exhume.evaluation.informed import reconstructed
from exhume.victim import load_victim


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("victim")
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--deflate", action="store_true")
    args = ap.parse_args(argv)
    victim = load_victim(args.victim)
    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)  # centred by the victim's own (public) mean
    pool = select_pool(ds, train.spec["task"], 1000, exclude=np.asarray(train.indices), seed=5)
    w = next(p for p in victim.model.parameters() if p.dim() == 2).detach().double()  # (h, d): the first layer
    x = train.centred.reshape(len(train), -1).double()
    hits, ratios = 0, []
    terms = _terms(victim, train) if args.deflate else None
    for t in range(min(args.targets, len(train))):
        if terms is not None:
            rem = w - (terms.sum(0) - terms[t]).reshape(w.shape)
        else:
            q, _ = torch.linalg.qr(torch.cat([x[:t], x[t + 1:]]).T)  # (d, n − 1): the known span
            rem = w - (w @ q) @ q.T
        _, s, vh = torch.linalg.svd(rem, full_matrices=False)
        ratios.append(float(s[1] / s[0]))
        v = vh[0]
        scale = x.abs().max()
        cands = torch.stack([(sign * v / v.abs().max() * scale).reshape(train.x.shape[1:]) for sign in (1, -1)])
        hits += int(reconstructed(train.x[t:t + 1], (cands + victim.mean.double()).clamp(0, 1).float(), pool.x)[0])
    print(f"targets reconstructed {hits} of {min(args.targets, len(train))}; sigma_2/sigma_1 of the remainder: median "
          f"{np.median(ratios):.3g} (min {min(ratios):.3g}, max {max(ratios):.3g})", flush=True)
    return 0


def _terms(victim, train) -> torch.Tensor:
    """Each record's first-layer term at a stationary point: ``(1/(n·w))·∇_{W₁}(−ℓ)``, flattened: ``(n, h·d)``."""
    from exhume.equations.stationarity import negative_loss_objective, per_candidate_gradients
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(victim.model, "cpu", torch.float64)
    size = next(p for p in params.values() if p.dim() == 2).numel()
    g = per_candidate_gradients(model, params, train.centred.double(), train.y.double(), negative_loss_objective(victim.loss))
    return g[:, :size] / (len(train) * victim.weight_decay)


if __name__ == "__main__":
    raise SystemExit(main())
