"""How much of a victim's weights its training points explain: all of ``θ``, and the learned part kkt's ``denoise`` keeps.

    python research/learned_share.py runs/zoo/victims/fashion-256-haim runs/zoo/victims/mnist-256-wd5e-3

For each victim: the non-negative least-squares fit of ``θ`` (and of
:func:`exhume.attacks.subspace.learned_part`'s target, where it replaces a layer) by the training
points' margin gradients (soft margin for 10-class victims; exact ReLU derivative, float64), the
share of ``‖θ‖²`` explained and each tensor's relative residual; and how the fit spreads over the
training points: how many get a multiplier above 0, the participation ratio of their contributions
``c_i = λ_i ‖∇_θ h_i‖`` (``(Σc)²/Σc²``), how many points carry 90 % of ``Σ c_i²``, and the ten
largest (training-set indices). Evaluator-side: reads the training set. Memory: ``n × P`` float64
gradients (100 points of a 1000-1000 MLP: about 1.4 GB).
"""

from __future__ import annotations

import argparse

import torch

from exhume.attacks.base import attack_model
from exhume.attacks.stationarity import fixed_part, per_candidate_gradients
from exhume.attacks.subspace import learned_part
from exhume.losses import margin, soft_margin
from exhume.victim import load_victim


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("victims", nargs="+", help="victim folders (with their training set's data spec)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for folder in args.victims:
        victim = load_victim(folder)
        task = victim.load_train_set()
        view = victim.attacker_view()
        model, params = attack_model(victim.model, "cpu", torch.float64)
        x = task.x.double() - view.mean.double()
        objective, y = (margin, task.y.double()) if victim.task == "binary" else (soft_margin, task.y)
        target, info = learned_part(params, view.n_train_hint or 100)
        print(f"{folder}: {info}")
        # each training point's gradient norm, ten points at a time (the fit itself holds all n × P)
        gnorm = torch.cat([per_candidate_gradients(model, params, x[i:i + 10], y[i:i + 10], objective).norm(dim=1)
                           for i in range(0, x.shape[0], 10)])
        for name, theta in (("θ", None), ("learned part", target)):
            if name != "θ" and theta is None:
                continue
            rest, lam, share = fixed_part(model, params, x, y, objective, theta=theta)
            base = params if theta is None else theta
            per = ", ".join(f"{k} {float((rest[k] ** 2).sum() / (base[k] ** 2).sum().clamp_min(1e-300)):.3f}" for k in params)
            print(f"  {name}: the {x.shape[0]} training points explain {share:.1%} of its ‖·‖²; residual per tensor: {per}", flush=True)
            lam = torch.as_tensor(lam, dtype=torch.float64).reshape(-1)
            c = lam * gnorm
            order = torch.argsort(c, descending=True)
            energy = torch.cumsum(c[order] ** 2, 0) / (c**2).sum().clamp_min(1e-300)
            carry = int(torch.searchsorted(energy, torch.tensor(0.9, dtype=energy.dtype))) + 1
            print(f"    multipliers above 0: {int((lam > 0).sum())}; participation ratio of the contributions "
                  f"{float(c.sum() ** 2 / (c**2).sum().clamp_min(1e-300)):.1f}; points carrying 90 % of Σc²: {carry}; "
                  f"largest: {order[:10].tolist()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
