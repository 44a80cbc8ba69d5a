"""EVALUATOR-SIDE: the exact training run on practitioner-zoo victims, at the training images and at unseen ones.

    python research/practitioner/exact_run.py ZOO --only fashion-cnn-sgdm ... [--json OUT.json] [--dtype float64]

For each victim: the recipe read from its ``training.json`` (``run.py``'s :func:`exact_recipe`), the relative gap
``‖Run(θ_0; x, y) − θ_T‖² / ‖θ_T − θ_0‖²`` with the training images (the truth: 0 up to rounding when the
recipe is the one that ran; the victims were trained in float32, the replay runs in ``--dtype``), with as many
unseen images and their labels (a control: what a wrong image set gives), and the seconds of one replay and of one
attack iteration (the replay, its checkpointed recomputation and the backward pass, float32), measured on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (exhume, benchmarks), research/practitioner/


def view_of(folder: Path):
    """The owner's view of a zoo victim with its whole recipe, and the centred training and unseen images with labels."""
    from benchmarks.practitioner.run import audit_settings, exact_recipe
    from exhume.audit import load_images, load_model_class, load_weights
    from exhume.audit.config import from_options
    from exhume.audit.facade import _audited, _request

    cfg = audit_settings(folder / "audit.toml")
    training = json.loads((folder / "training.json").read_text())
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    ux, uy = load_images(cfg.unseen, need_labels=True)
    run = from_options(cfg, out=None, method="simulate", attack_args={"run": "exact"}, start=str(folder / "start.safetensors"),
                       training=exact_recipe(training))
    a = _audited(model, (x, y), ux, run, _request(run, False, False)[0].threat)
    n = len(x)
    from exhume.audit.facade import _labels

    uyy, _ = _labels(uy[:n], a.view.task, a.view.num_classes or 2, None)
    return a, (a.unseen[:n] - a.view.mean), uyy


def measure(folder: Path, dtype: str) -> dict:
    from exhume.attacks.exact import exact_residual, hard_labels, make_replay, relative_gap, replay
    from exhume.attacks.workcopy import attack_model

    t0 = time.perf_counter()
    a, ucentred, uy = view_of(folder)
    at_train = a.measured["value"]
    seconds_replay = time.perf_counter() - t0
    control = exact_residual(a.view, ucentred, uy)["value"]
    model, params = attack_model(a.view.model, "cpu", getattr(torch, dtype))
    r = make_replay(model, params, a.view.start, a.view.training, len(a.centred), a.view.task)
    x = a.centred.to(getattr(torch, dtype)).clone().requires_grad_()
    q = hard_labels(a.view.task, a.y, a.view.num_classes, x.dtype)
    t1 = time.perf_counter()
    gap = relative_gap(r, replay(r, x, q), {k: params[k].detach() for k in r.names})
    gap.backward()
    return {"victim": folder.name, "steps": len(r.order), "segment": r.segment, "gap_train_float64": at_train,
            "gap_train_float32_graph": float(gap), "gap_unseen_float64": control,
            "seconds_replay_and_setup_float64": round(seconds_replay, 1), "seconds_attack_iteration_float32": round(time.perf_counter() - t1, 1),
            "grad_norm_at_truth": float(x.grad.norm())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("zoo")
    ap.add_argument("--only", nargs="+", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="the attack iteration's dtype")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.only:
        rows.append(measure(Path(args.zoo) / name, args.dtype))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
