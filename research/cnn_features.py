"""The span one layer up on a CNN: kkt in feature space, then the features inverted to images (one-off, not maintained).

    python research/cnn_features.py VICTIM --out DIR --layer head.0 --seconds 120 --invert-steps 1500

1. The network above the module ``--layer`` (its input replaced by the unknowns: a forward pre-hook) becomes an
   attacker's view whose inputs are the features, scaled into [0, 1] by ``s`` (the largest feature of random
   valid images, attacker-side); kkt runs on it with its defaults (``subspace="auto"`` now finds the span in that
   layer's weights, where the stationary CNN shows it). One run, ``--seconds``.
2. EVALUATOR-SIDE: each training image's features against the nearest candidate's (relative error).
3. Each candidate's features are inverted through the layers below (Adam on the pixels, display prior, ``--tv``),
   the result saved as a kkt Reconstruction in ``DIR/recon`` for ``exhume evaluate``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from torch import nn

import exhume
from exhume.victim import AttackerView, load_victim


class Above(nn.Module):
    """``model`` from module ``layer``'s input on: ``forward(v)`` feeds ``scale · v`` to ``layer`` in place of its input.
    The parameters below ``layer`` become buffers (fixed, not part of θ)."""

    def __init__(self, model: nn.Module, layer: str, input_shape, scale: float, below: list[str]):
        super().__init__()
        self.net = copy.deepcopy(model)
        for name in below:
            mod_name, _, pname = name.rpartition(".")
            mod = self.net.get_submodule(mod_name)
            t = getattr(mod, pname).detach().clone()
            del mod._parameters[pname]
            mod.register_buffer(pname, t)
        self.input_shape, self.scale, self._v = tuple(input_shape), float(scale), None
        self.net.get_submodule(layer).register_forward_pre_hook(self._feed)  # a bound method: deepcopy rebinds it

    def _feed(self, module, args):
        return (self._v * self.scale,)

    def forward(self, v):
        self._v = v
        dummy = v.new_zeros((v.shape[0], *self.input_shape))
        return self.net(dummy)


def features_of(model: nn.Module, layer: str, x: torch.Tensor) -> torch.Tensor:
    got = []
    h = model.get_submodule(layer).register_forward_pre_hook(lambda m, a: got.append(a[0]))
    try:
        model(x)
    finally:
        h.remove()
    return got[0].reshape(x.shape[0], -1)


def invert(model, layer, target, mean, steps, lr, tv, seed):
    """Pixels whose features match ``target`` (m × D): Adam on centred pixels, display prior [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn((target.shape[0], *mean.shape), generator=gen) * 0.1).requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    tn = target.norm(dim=1).clamp_min(1e-12)
    for _ in range(steps):
        opt.zero_grad()
        f = features_of(model, layer, x)
        fit = (((f - target).norm(dim=1) / tn) ** 2).sum()
        v = x + mean
        prior = (torch.relu(v - 1) ** 2 + torch.relu(-v) ** 2).sum()
        smooth = ((v[..., 1:, :] - v[..., :-1, :]) ** 2).sum() + ((v[..., :, 1:] - v[..., :, :-1]) ** 2).sum()
        (fit + prior + tv * smooth).backward()
        opt.step()
    with torch.no_grad():
        f = features_of(model, layer, x)
        err = ((f - target).norm(dim=1) / tn)
    return (x.detach() + mean).clamp(0, 1), err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("victim")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layer", default="head.0")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--invert-steps", type=int, default=1500)
    ap.add_argument("--invert-lr", type=float, default=0.02)
    ap.add_argument("--tv", type=float, default=0.0)
    ap.add_argument("-p", action="append", default=[], help="kkt setting KEY=VALUE for the feature stage")
    ap.add_argument("--oracle", action="store_true", help="ORACLE: invert the training images' true features")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    victim = load_victim(a.victim)
    view = victim.attacker_view()
    model = view.model.eval()
    n = view.n_train_hint or 100
    mean = view.mean.float()
    # attacker-side feature scale: the largest feature of random valid images
    gen = torch.Generator().manual_seed(1)
    probe = torch.rand((64, *view.input_shape), generator=gen) - mean
    with torch.no_grad():
        scale = float(features_of(model, a.layer, probe).max())
    mod_prefix = a.layer + "."
    names = [k for k, _ in model.named_parameters()]
    order = names.index(next(k for k in names if k.startswith(mod_prefix)))
    below = names[:order]
    above = Above(model, a.layer, view.input_shape, scale, below)
    d = features_of(model, a.layer, probe[:1]).shape[1]
    fview = AttackerView(model=above, task=view.task, input_shape=(d,), mean=torch.zeros(d), loss=view.loss,
                         weight_decay=view.weight_decay, num_classes=view.num_classes, n_train_hint=n)
    settings = {}
    for kv in a.p:
        k, _, v = kv.partition("=")
        settings[k] = json.loads(v) if v[:1] in "0123456789-[{\"tf" else v
    train = victim.train_set
    with torch.no_grad():
        truth = features_of(model, a.layer, train.centred.float())
    t0 = time.perf_counter()
    if a.oracle:
        feats, labels, cfg = truth, train.y, {"oracle": "true features"}
    else:
        recon = exhume.attack(fview, method="kkt", seed=a.seed, max_seconds=a.seconds, restarts=1, progress=False, **settings)
        feats, labels, cfg = recon.candidates.reshape(recon.candidates.shape[0], -1) * scale, recon.labels, recon.config
    stage = time.perf_counter() - t0
    # EVALUATOR-SIDE: nearest candidate feature per training image
    dist = torch.cdist(truth.double(), feats.double()) / truth.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
    best = dist.min(dim=1).values
    row = {"victim": a.victim, "layer": a.layer, "scale": scale, "stage_seconds": round(stage, 1), "settings": settings,
           "subspace": {k: v for k, v in cfg.items() if str(k).startswith("subspace")},
           "feature_err_median": float(best.median()), "feature_err_within_0.1": int((best < 0.1).sum()),
           "feature_err_within_0.3": int((best < 0.3).sum())}
    t1 = time.perf_counter()
    images, err = invert(model, a.layer, feats.float(), mean, a.invert_steps, a.invert_lr, a.tv, a.seed)
    row.update(invert_seconds=round(time.perf_counter() - t1, 1), invert_err_median=float(err.median()))
    from exhume.attacks.base import Reconstruction

    rec = Reconstruction(method="kkt", candidates=images, labels=labels, scores=torch.ones(images.shape[0]),
                         config={"feature_stage": row}, seed=a.seed, loss_history=[], summary={"iterations": 0, "seconds": stage})
    rec.save(out / "recon")
    torch.save({"features": feats, "labels": labels}, out / "features.pt")
    print(json.dumps(row), flush=True)
    (out / "row.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
