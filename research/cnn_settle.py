"""Train a CNN victim in phases and watch where the training inputs' span shows (one-off, not maintained).

    python research/cnn_settle.py --out DIR --phases 0.2:3000 0.05:20000:0.0 --save-at 3000 23000

Each phase ``lr:epochs[:momentum]`` is full-batch (heavy-ball momentum where given) on mean logistic loss +
(wd/2)‖θ‖². Every ``--every`` epochs it logs: the data loss, the relative stationarity residual, and for the fully
connected layer after the convolutions: σ_n/σ_1, σ_{n+1}/σ_1, the directions holding 99.9 % of its energy, and
(EVALUATOR-SIDE) the median relative distance of the training images' features to its top-n row space. Victim
folders are saved at the epochs of ``--save-at`` (``DIR/e<epoch>``), readable by ``exhume attack``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from exhume.data import load_dataset
from exhume.data.tasks import select_task
from exhume.losses import per_sample_loss, relative_objective_gradient
from exhume.models import build_model, parse_arch
from exhume.victim.build import _test_accuracy, accuracy
from exhume.victim.victim import Victim


def fc_stats(model, x, n):
    w = model.head[0].weight.detach().double()
    s = torch.linalg.svdvals(w)
    e = (s ** 2).cumsum(0) / (s ** 2).sum()
    k999 = int((e < 0.999).sum()) + 1
    with torch.no_grad():
        f = model.features(x).flatten(1).double()
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    v = vh[:n].T
    d = (f - (f @ v) @ v.T).norm(dim=1) / f.norm(dim=1).clamp_min(1e-30)
    return {"s_n": float(s[n - 1] / s[0]), "s_n1": float(s[n] / s[0]), "k999": k999, "feat_dist_med": float(d.median()),
            "feat_dist_max": float(d.max())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="mnist")
    ap.add_argument("--root", default=None)
    ap.add_argument("--arch", default="cnn:16;fc=256;pool=avg")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--wd", type=float, default=5e-3)
    ap.add_argument("--phases", nargs="+", required=True)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--save-at", type=int, nargs="*", default=[])
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, a.dtype)
    ds = load_dataset(a.data, root=a.root)
    td = select_task(ds, "odd-even", a.n, seed=a.seed)
    spec = parse_arch(a.arch)
    torch.manual_seed(a.seed)
    model = build_model(spec, tuple(td.x.shape[1:]), 1).to(dtype)
    x, y = td.centred.to(dtype), td.y.to(dtype)
    params = list(model.parameters())
    log = open(out / "log.jsonl", "a")
    epoch, t0 = 0, time.process_time()
    for ph in a.phases:
        parts = ph.split(":")
        lr, ep = float(parts[0]), int(parts[1])
        mom = float(parts[2]) if len(parts) > 2 else 0.0
        opt = torch.optim.SGD(params, lr=lr, momentum=mom)
        for _ in range(ep):
            epoch += 1
            opt.zero_grad(set_to_none=True)
            data = per_sample_loss("logistic", model(x), y).mean()
            (data + 0.5 * a.wd * sum((p ** 2).sum() for p in params)).backward()
            opt.step()
            if not np.isfinite(float(data)):
                raise SystemExit(f"diverged at {epoch}")
            if epoch % a.every == 0 or epoch in a.save_at:
                rec = {"epoch": epoch, "lr": lr, "momentum": mom, "cpu_s": round(time.process_time() - t0, 1),
                       "loss": float(data), "residual": relative_objective_gradient(model, x, y, "logistic", a.wd),
                       **fc_stats(model, x, a.n)}
                print(json.dumps(rec), flush=True)
                log.write(json.dumps(rec) + "\n")
                log.flush()
            if epoch in a.save_at:
                m = model.float()
                metrics = {"epochs": epoch, "train_accuracy": accuracy(m, x.float(), y.float()),
                           "stationarity_residual": relative_objective_gradient(m, x.float(), y.float(), "logistic", a.wd),
                           "recipe": a.phases}
                metrics.update(_test_accuracy(m, ds, "odd-even", td, 1000, None, a.seed, torch.float32))
                v = Victim(model=m.eval(), task="binary", input_shape=tuple(td.x.shape[1:]), mean=td.mean, loss="logistic",
                           weight_decay=a.wd, arch=spec,
                           train_config={"loss": "logistic", "optimizer": "gd", "lr": lr, "weight_decay": a.wd,
                                         "phases": a.phases, "seed": a.seed, "dtype": a.dtype},
                           metrics=metrics, data_spec=td.spec, train_indices=np.asarray(td.indices))
                v.save(out / f"e{epoch}")
                model = m.to(dtype).train()
                params = list(model.parameters())


if __name__ == "__main__":
    main()
