"""The feature stage twice: stage, inversion, then a second stage started at the inverted images' features projected
onto the span, and a second inversion started at the first's images (one-off, not maintained).

    python research/cnn_alternate.py VICTIM --out DIR --seconds 240 [--rounds 2]

Each round gets seconds/rounds: 75 % feature stage, 25 % inversion (exhume/attacks/feature_stage.py's split).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from exhume.attacks import get_attack
from exhume.attacks.feature_stage import feature_view, features_of, layer_above
from exhume.victim import load_victim


def invert_from(model, layer, target, mean, x0, seconds, lr=0.02):
    x = (x0 - mean).clone().requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    norm = target.norm(dim=1).clamp_min(1e-12)
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds and steps < 1000:
        steps += 1
        opt.zero_grad()
        fit = ((features_of(model, layer, x) - target).norm(dim=1) / norm).pow(2).sum()
        v = x + mean
        (fit + (torch.relu(v - 1) ** 2 + torch.relu(-v) ** 2).sum()).backward()
        opt.step()
    with torch.no_grad():
        err = (features_of(model, layer, x) - target).norm(dim=1) / norm
    return (x.detach() + mean), float(err.median()), steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("victim")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    victim = load_victim(a.victim)
    view = victim.attacker_view()
    model, mean = view.model, view.mean.float()
    above, span = layer_above(model, tuple(view.input_shape), mean, 100)
    fview = feature_view(view, above)
    per = a.seconds / a.rounds
    gen = torch.Generator().manual_seed(a.seed)
    images = (torch.randn((200, *view.input_shape), generator=gen) * 0.1 + mean)
    init, log = None, []
    for r in range(a.rounds):
        kw = {} if init is None else {"init": init, "init_name": "features"}
        stage = get_attack("kkt", max_seconds=0.75 * per, background=0.0).run(fview, seed=a.seed + r, progress=False, **kw)
        target = stage.candidates.reshape(200, -1) * above.scale
        images, err, steps = invert_from(model, above.layer, target, mean, images, 0.25 * per)
        with torch.no_grad():
            f = features_of(model, above.layer, images - mean) / above.scale
            init = (f @ span.basis) @ span.basis.T  # onto the span
        log.append({"round": r, "stage_iterations": stage.summary["iterations"], "stage_residual": stage.summary["final_relative_stationarity"],
                    "inversion_error": err, "inversion_steps": steps})
        print(json.dumps(log[-1]), flush=True)
    from exhume.attacks.base import Reconstruction
    from exhume.attacks.priors import background_level, dark_floor

    tau, _ = background_level("auto", view.mean, tuple(view.input_shape))
    Reconstruction(method="kkt", candidates=dark_floor(images, tau), labels=stage.labels, scores=stage.scores, config={"alternate": log}, seed=a.seed,
                   summary={"iterations": 0, "seconds": a.seconds}).save(a.out)


if __name__ == "__main__":
    main()
