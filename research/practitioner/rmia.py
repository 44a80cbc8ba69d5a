"""A reference-model membership attack (RMIA, Zarifzadeh et al. 2024, offline) on a practitioner-zoo victim.

    nice -n 10 python research/practitioner/rmia.py ZOO NAME [NAME ...] --refs 2 --a 0.3 --out RUNS/rmia.json

What practitioners' tools (ML Privacy Meter, LeakPro) report, beside the audit's membership from the weights
(metrics.json's ``membership_exposure``). For each victim: ``--refs`` reference models trained by the owner's recipe
(``build.py``'s Spec: the same start, optimiser, epochs and batch size; shuffling seeded differently) on disjoint blocks
of ``n`` of the victim's unseen images; the members are the training images, the non-members the unseen images in no
reference block. Score: ``Pr(x)_target / (½((1 + a)·mean_k Pr(x)_ref_k + (1 − a)))``, ``Pr(x)`` the probability of
the record's label; with γ = 1 RMIA's pairwise test against population samples is a monotone function of this ratio,
so its ROC is the ratio's. Also the record's probability alone (the loss attack on the same records). AUC and TPR at
1 % / 0.1 % FPR with 95 % bootstrap intervals (:func:`exhume.evaluation.weights_membership.roc_summary`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (exhume, benchmarks), research/practitioner/

from benchmarks.practitioner import build  # noqa: E402


def probabilities(spec, model, x: torch.Tensor, y: np.ndarray) -> np.ndarray:
    """``Pr(label | x)`` under ``model`` (x: model inputs)."""
    with torch.no_grad():
        out = model.eval()(x)
    if spec.task == "odd-even":
        p1 = torch.sigmoid(out.squeeze(1)).double().numpy()
        return np.where(y == 1, p1, 1 - p1)
    return torch.softmax(out.double(), 1).numpy()[np.arange(len(y)), y]


def victim(folder: Path, spec):
    """The victim's model, its start, training and unseen arrays (as build.py wrote them)."""
    from safetensors.torch import load_file

    start = load_file(str(folder / "start.safetensors"))
    model = build.start_model(spec, None)
    model.load_state_dict(load_file(str(folder / "weights.safetensors")))
    train, unseen = np.load(folder / "train.npz"), np.load(folder / "unseen.npz")
    return model, start, (train["x"], train["y"]), (unseen["x"], unseen["y"])


def reference(spec, start: dict, x: np.ndarray, y: np.ndarray, k: int):
    """A reference model: the owner's recipe from the same start on other images, shuffled with another seed."""
    ref_spec = replace(spec, seed=spec.seed + 1000 + k)
    model = build.start_model(ref_spec, None)
    model.load_state_dict(start)
    build.fit(ref_spec, model, build.model_inputs(spec, x), torch.from_numpy(y))
    return model


def attack(zoo: Path, name: str, refs: int, a: float, seed: int) -> dict:
    from exhume.evaluation.weights_membership import roc_summary

    torch.set_num_threads(1)
    spec = build.BY_NAME[name]
    model, start, (tx, ty), (ux, uy) = victim(zoo / name, spec)
    n = len(tx)
    if (refs + 1) * n > len(ux) + n:
        raise SystemExit(f"{name}: {len(ux)} unseen images cannot give {refs} reference blocks of {n} and non-members")
    ref_models = [reference(spec, start, ux[k * n:(k + 1) * n], uy[k * n:(k + 1) * n], k) for k in range(refs)]
    nx, ny = ux[refs * n:][:1000], uy[refs * n:][:1000]
    scores = {}
    for label, (x, y) in (("members", (tx, ty)), ("nonmembers", (nx, ny))):
        xt = build.model_inputs(spec, x)
        target = probabilities(spec, model, xt, y)
        ref = np.mean([probabilities(spec, r, xt, y) for r in ref_models], axis=0)
        scores[label] = {"rmia": target / (0.5 * ((1 + a) * ref + (1 - a))), "probability": target}
    out = {"victim": name, "refs": refs, "a": a, "n_members": n, "n_nonmembers": len(nx)}
    for score in ("rmia", "probability"):
        out[score] = roc_summary(scores["members"][score], scores["nonmembers"][score], seed)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("zoo")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--refs", type=int, default=2)
    ap.add_argument("--a", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = []
    for name in args.names:
        rows.append(attack(Path(args.zoo), name, args.refs, args.a, args.seed))
        r = rows[-1]
        print(name, {s: (round(r[s]["auc"]["value"], 3), r[s]["tpr_at_0.01_fpr"]) for s in ("rmia", "probability")}, flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
