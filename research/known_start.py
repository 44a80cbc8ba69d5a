"""Known start: which equation explains what training added, and which attack recovers the training images.

Victims: folders in the practitioner zoo's layout (``research/known_start_victims.py`` writes
prototypes; ``runs/pzoo`` holds the zoo): ``audit.toml`` (model, normalisation, loss,
weight decay), ``weights.safetensors``, ``start.safetensors``, ``train.npz``, ``unseen.npz``,
``training.json`` and, for Adam, ``optimizer_state.safetensors``.

    explain VICTIM...   evaluator side, float64 least squares: the relative residual of each
                        equation with the training images as the candidates, against as many unseen
                        images (the gap is the signal an attack can find)
    attack VICTIM...    each variant run for --iterations at one seed (one core), judged with
                        exhume.evaluate against the training images and the unseen pool/control
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import exhume
from exhume.attacks.stationarity import negative_loss_objective
from exhume.attacks.subspace import learned_part
from exhume.attacks.trajectory import StartEquation, build_equation, explained
from exhume.audit.command import _read_config
from exhume.audit.facade import _head, _labels, _normalisation, _tensor_images
from exhume.audit.loading import load_images, load_model_class, load_weights
from exhume.losses import margin, soft_margin
from exhume.victim import AttackerView
from exhume.victim.start import TrainingSettings, load_second_moment, load_start
from exhume.victim.wrap import Audited


@dataclass
class Case:
    name: str
    view: AttackerView  # with the start and the training settings
    x: torch.Tensor  # training images, display space
    y: torch.Tensor  # exhume's labels (±1 or class ids)
    unseen: torch.Tensor
    unseen_y: torch.Tensor | None
    settings: dict


def settings_of(info: dict) -> TrainingSettings:
    """The training settings of a ``training.json`` (this script's prototypes, or the practitioner zoo's nested optimizer)."""
    opt = info.get("optimizer")
    if isinstance(opt, dict):
        info = {**info, **{k: v for k, v in opt.items() if k in ("lr", "weight_decay", "momentum", "betas", "eps")}}
        opt = opt.get("name")
    return TrainingSettings(optimizer=opt, lr=info.get("lr"), momentum=info.get("momentum") or 0.0,
                            betas=tuple(info.get("betas") or (0.9, 0.999)), eps=info.get("eps") or 1e-8,
                            weight_decay=info.get("weight_decay"), steps=info.get("steps"))


def load_case(folder: Path, second_moment: bool = True) -> Case:
    cfg = _read_config(str(folder / "audit.toml"))
    model = load_weights(load_model_class(str(folder / cfg["model"]), cfg.get("model_args")), folder / cfg["weights"])
    xr, yr = load_images(folder / cfg["train"])
    ur, yu = load_images(folder / cfg["unseen"], need_labels=False)
    x, unseen = _tensor_images(xr, "train"), _tensor_images(ur, "unseen")
    norm = cfg["normalize"]
    norm = norm if norm == "none" else [[float(v)] for v in norm.split(",")]
    mean, std, _ = _normalisation(norm if norm == "none" else (norm[0][0], norm[1][0]), tuple(x.shape[1:]))
    task, head, k = _head(model, (x[:2] - mean) / std, None, cfg["loss"])
    y, _ = _labels(yr, task, k, None)
    yu = _labels(yu, task, k, None)[0] if yu is not None else None
    wrapped = Audited(model, std, head).eval()
    info = json.loads((folder / "training.json").read_text())
    training = settings_of(info)
    state_file = folder / "optimizer_state.safetensors"
    if second_moment and state_file.is_file():
        moment, step = load_second_moment(state_file, model)
        training.second_moment, training.adam_step = moment, step or training.steps
    start = load_start(folder / "start.safetensors", model, partial=True)
    view = AttackerView(model=wrapped, task=task, input_shape=tuple(x.shape[1:]), mean=mean, loss=cfg["loss"],
                        weight_decay=float(cfg["weight_decay"]), num_classes=k if task == "multiclass" else None,
                        n_train_hint=len(x), start=start, training=training)
    return Case(folder.name, view, x, y, unseen, yu, info)


def weights_only(params, denoise: bool, n: int) -> StartEquation:
    target = learned_part(params, n)[0] if denoise else None
    target = target or params
    names = tuple(params)
    return StartEquation(names, [params], {k: target[k] for k in names}, None, float(sum((target[k] ** 2).sum() for k in names)))


def equations(case: Case, model, params):
    """The equations compared by ``explain``: (label, StartEquation, objective)."""
    view, n = case.view, len(case.x)
    h = soft_margin if view.task == "multiclass" else margin
    out = [("weights only: θ_T", weights_only(params, False, n), h), ("weights only: learned part", weights_only(params, True, n), h)]
    for eq, decay, pre in (("trajectory", "fit", "none"), ("trajectory", "auto", "none"), ("endpoints", "fit", "none")):
        out.append((f"{eq}, c {decay}, P {pre}", build_equation(view, model, params, eq, n, decay, pre), h))
    at_start = build_equation(view, model, params, "endpoints", n, 1.0, "none")
    at_start.points = at_start.points[:1]
    out.append(("Loo: θ_T − θ_0 on ∇h(θ_0)", at_start, h))
    shared = build_equation(view, model, params, "endpoints", n, "fit", "none")
    shared.shared = True
    out.append(("endpoints, one λ for both (mean gradient)", shared, h))
    loo = build_equation(view, model, params, "endpoints", n, 1.0, "none")
    out.append(("Loo: θ_T − θ_0 on ∇ℓ(θ_0), ∇ℓ(θ_T)", loo, negative_loss_objective(view.loss)))
    if view.training is not None and view.training.second_moment is not None:
        for eq in ("trajectory", "endpoints"):
            out.append((f"{eq}, c fit, P adam state", build_equation(view, model, params, eq, n, "fit", "state"), h))
    return out


def explain(case: Case, count: int | None, nonnegative: bool = False) -> list[dict]:
    from exhume.attacks.base import attack_model

    model, params = attack_model(case.view.model, "cpu", torch.float64)
    mean = case.view.mean.double()
    n = count or len(case.x)
    xt, yt = case.x[:n].double() - mean, case.y[:n]
    gen = torch.Generator().manual_seed(0)
    pick = torch.randperm(len(case.unseen), generator=gen)[:n]
    xu = case.unseen[pick].double() - mean
    yu = case.unseen_y[pick] if case.unseen_y is not None else yt
    rows = []
    for label, eq, h in equations(case, model, params):
        t0 = time.perf_counter()
        tr, un = explained(model, eq, xt, yt, h, nonnegative), explained(model, eq, xu, yu, h, nonnegative)
        label += " λ≥0" if nonnegative else ""
        rows.append({"victim": case.name, "equation": label, "train": tr["relative_residual"], "unseen": un["relative_residual"],
                     "c_train": tr["decay_fitted"], "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


#: the variants compared by ``attack`` (kkt keyword arguments); "weights-*" run on the view without its start
VARIANTS = {
    "weights-only": {"start_equation": "stationary"},
    "weights-trajectory": {"start_equation": "trajectory"},
    "trajectory": {"start_equation": "trajectory", "candidates_per_point": 2.0},
    "endpoints": {"start_equation": "endpoints", "candidates_per_point": 2.0},
    # Loo et al.'s known-initialisation reconstruction as SimuDy's code runs it: −∇ℓ at θ_0 and θ_T, signed α, θ_T − θ_0
    "loo": {"start_equation": "endpoints", "formulation": "loss", "start_decay": 1.0, "subspace": "off", "preconditioner": "none",
            "start_multipliers": "signed", "candidates_per_point": 2.0},
    "simulate": {"method": "simulate"},
}


def run_variant(case: Case, variant: str, kwargs: dict, iterations: int, seed: int, out: Path | None = None,
                oracle_init: bool = False) -> dict:
    """One kkt run of ``variant`` and its evaluation: a table row."""
    from dataclasses import replace

    from exhume.attacks import get_attack

    view = case.view if not variant.startswith("weights-") else replace(case.view, start=None, training=None)
    kwargs = dict(kwargs)
    method = kwargs.pop("method", "kkt")
    budget = {"iterations": iterations, **({"snapshot_every": max(1, iterations // 4)} if method == "kkt" else {})}
    atk = get_attack(method, **budget, **kwargs)
    init = {"init": case.x, "init_name": "ground-truth"} if oracle_init else {}  # ORACLE: starts at the training images
    recon = atk.run(view, seed=seed, progress=False, **init)
    folder = None if out is None else out / case.name / variant
    if folder is not None:
        recon.save(folder)
    ev = exhume.evaluate(recon, train=(case.x.numpy(), case.y.numpy()), unseen=case.unseen.numpy(), figures=folder is not None,
                         out=None if folder is None else folder / "evaluation")
    m = ev.metrics
    return {"victim": case.name, "variant": variant, "memorised": m["memorised"], "control": m["memorised_control"],
            "one_to_one>=0.4": m.get("one_to_one_ssim>=0.4"), "one_to_one_mean": round(m["one_to_one_ssim_mean"], 3),
            "n": len(case.x), "m": recon.candidates.shape[0], "verdict": m["verdict"], "iterations": recon.summary["iterations"],
            "seconds": recon.summary["seconds"], "residual": round(recon.summary["final_relative_stationarity"], 4),
            "span": recon.config.get("subspace_rank"), "equation": recon.config.get("equation_used"),
            **({"init": "ORACLE: the training images"} if oracle_init else {})}


def table(rows: list[dict]) -> str:
    """Rows of ``explain`` (victim × equation: train / unseen residual) or ``attack`` (victim × variant) as markdown."""
    if rows and "train" in rows[0]:
        head = "| victim | equation | training images | unseen images |\n|---|---|---|---|\n"
        return head + "".join(f"| {r['victim']} | {r['equation']} | {r['train']:.3f} | {r['unseen']:.3f} |\n" for r in rows)
    head = ("| victim | n | variant | memorised | control | one-to-one ≥ 0.4 | mean one-to-one SSIM | verdict | iterations "
            "| seconds | residual |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(f"| {r['victim']} | {r['n']} | {r['variant']} | {r['memorised']} | {r['control']} | {r['one_to_one>=0.4']} "
                          f"| {r['one_to_one_mean']} | {r['verdict']} | {r['iterations']} | {r['seconds']:.0f} | {r['residual']} |\n"
                          for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("explain")
    p.add_argument("victims", nargs="+", type=Path)
    p.add_argument("--count", type=int, default=None, help="use the first COUNT training images (default all)")
    p.add_argument("--nonnegative", action="store_true", help="multipliers λ ≥ 0 with the margin objective")
    p = sub.add_parser("attack")
    p.add_argument("victims", nargs="+", type=Path)
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="a kkt parameter for every variant")
    p.add_argument("--out", type=Path, default=None, help="save each reconstruction and its evaluation (with figures) here")
    p.add_argument("--oracle-init", action="store_true", help="ORACLE: start the candidates at the training images")
    p = sub.add_parser("table", help="markdown tables from the JSON lines of explain / attack")
    p.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "table":
        print(table([json.loads(line) for f in args.files for line in f.read_text().splitlines() if line.startswith("{")]))
        return 0
    torch.set_num_threads(1)
    if args.cmd == "explain":
        for folder in args.victims:
            explain(load_case(folder), args.count, args.nonnegative)
        return 0
    from exhume.params import parse_params

    extra = parse_params(args.param)
    for folder in args.victims:
        case = load_case(folder)
        for v in args.variants:
            name, _, more = v.partition("+")
            kwargs = {**VARIANTS[name], **extra, **(parse_params(more.split(",")) if more else {})}
            print(json.dumps(run_variant(case, v, kwargs, args.iterations, args.seed, args.out, args.oracle_init)), flush=True)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
