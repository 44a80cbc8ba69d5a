"""The informed adversary's free reconstruction, two ways that were measured and left out of the package.

    python research/informed_free.py solve VICTIM --targets 6 --iterations 1500      # the projected equation, solved
    python research/informed_free.py read VICTIM                                       # the remainder's first layer, rank one

VICTIM: a victim folder (`exhume experiment dp`'s `cells/paper_none_s0/victim`, or any full-batch MLP).
For each target t (the first ``--targets`` training records) every other training record is known;
P⊥ projects off their columns ``∇_θ(−ℓ(x_k))`` (their multipliers unknown).

- ``solve``: candidates (``--m``, half per label) minimise ``‖P⊥θ − Σ_j (u_j/(n·w)) P⊥∇_θ(−ℓ(x̂_j))‖² / ‖P⊥θ‖²``
  + the pixel-range prior, x̂ kept in the first layer's span, Adam (lr 1e-2), u ≥ 0 learned;
- ``read``: the top right singular vectors of the remainder's first layer, both signs, scaled to the
  data's range.

A target is reconstructed when its best candidate's SSIM beats its best image among 1,000 unseen ones
(the memorisation criterion). Evaluator-side: reads the training set to play the known records.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.func import functional_call, grad

from exhume.attacks.engine.priors import range_penalty
from exhume.attacks.kkt.subspace import data_subspace
from exhume.data import load_dataset
from exhume.data.tasks import select_pool
from exhume.equations.span import learned_part
from exhume.equations.stationarity import negative_loss_objective, per_candidate_gradients
from exhume.equations.surrogate import soft_activations
from exhume.equations.workcopy import attack_model
from exhume.evaluation.ssim import ssim_matrix
from exhume.victim import load_victim


def setup(folder: str):
    victim = load_victim(folder)
    view = victim.attacker_view()
    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    pool = select_pool(ds, train.spec["task"], 1000, exclude=np.asarray(train.indices), seed=5)
    model, params = attack_model(view.model, "cpu", torch.float64)
    obj = negative_loss_objective("logistic")
    mean = view.mean.double()
    cols = per_candidate_gradients(model, params, train.x.double() - mean, train.y.double(), obj)
    best_pool = ssim_matrix(train.x.float(), pool.x.float()).max(1).values
    return view, train, model, params, obj, mean, cols, best_pool


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("solve", "read"))
    ap.add_argument("victim")
    ap.add_argument("--targets", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=1500)
    ap.add_argument("--m", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    view, train, model, params, obj, mean, G, best_pool = setup(args.victim)
    n, names = len(train), list(params)
    learned, _ = learned_part(params, n)
    theta = torch.cat([(learned or {}).get(k, params[k]).reshape(-1) for k in names])
    gram, lam0 = G @ G.T, 1.0 / (n * float(view.weight_decay))
    span = data_subspace(model, params, tuple(view.input_shape), n)
    hits, t0 = 0, time.time()
    for t in range(args.targets if args.mode == "solve" else n):
        k = [i for i in range(n) if i != t]
        A, L = G[k], torch.linalg.cholesky(gram[np.ix_(k, k)])

        def perp(v, A=A, L=L):
            return v - A.T @ torch.cholesky_solve((A @ v)[:, None], L)[:, 0]

        tp = perp(theta)
        if args.mode == "read":
            w = tp[:params[names[0]].numel()].reshape(params[names[0]].shape)
            _, sv, vh = torch.linalg.svd(w, full_matrices=False)
            vh = vh[:2]
            print("sigma_2/sigma_1", round(float(sv[1] / sv[0]), 3), end=" ")
            imgs = [(s * v).reshape(train.x.shape[1:]) for v in vh for s in (1, -1)]
            cands = torch.stack([(i / i.abs().max() * (train.x.double() - mean).abs().max() + mean).clamp(0, 1) for i in imgs])
        else:
            x = span.project(torch.randn((args.m, *train.x.shape[1:]), generator=torch.Generator().manual_seed(t), dtype=torch.float64)
                             * 1.7e-3).requires_grad_()
            u = torch.full((args.m,), 0.5, dtype=torch.float64, requires_grad=True)
            yc = torch.tensor([1.0, -1.0] * (args.m // 2), dtype=torch.float64)
            opt = torch.optim.Adam([x, u], lr=1e-2)
            for _ in range(args.iterations):
                with soft_activations(19.0):
                    g = grad(lambda p, x=x, u=u, yc=yc: ((lam0 * u) * obj(functional_call(model, p, (x,)), yc)).sum())(params)
                v = tp - perp(torch.cat([g[kk].reshape(-1) for kk in names]))
                loss = (v @ v) / (tp @ tp) + range_penalty(x + mean, 0.0, 1.0) + 5.0 * (torch.relu(-u) ** 2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    x.copy_(span.project(x))
            cands = (x.detach() + mean).clamp(0, 1)
        best = float(ssim_matrix(train.x[t:t + 1].float(), cands.float())[0].max())
        hits += best > float(best_pool[t])
        print(t, round(best, 3), "pool", round(float(best_pool[t]), 3), round(time.time() - t0, 1), "s", flush=True)
    print(f"{args.mode}: {hits} targets reconstructed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
