"""EVALUATOR-SIDE diagnostic (it reads the training set): which victims' weights carry their training images?

    python research/practitioner/explain.py OUT [--only NAME ...] [--md FILE]

In float64 with exact derivatives, least squares on the flattened trained parameters (parameters
equal to their start, i.e. frozen, are left out) of how much is explained by per-sample parameter
gradients ``∇_θ h(x_i)`` of the n training images (``h``: the margin, the loss, or, for K > 1
logits, each logit: K directions per image), against the same fit with n unseen images (the
no-signal baseline). Printed as relative residuals ``‖r‖ / ‖target‖``
(0: explained exactly, 1: not at all):

- (i)   weights only: target ``θ``, directions the gradients at the final weights;
- (0)   the start alone: target ``θ − θ_start``, the one direction ``θ_start`` (weight decay shrinks it);
- (ii)  target ``θ − θ_start``, directions the gradients at the final weights and ``θ_start``;
- (iii) as (ii) with the gradients at the start as well (the linearisation of a known-start attack).

A victim carries signal where the training images explain clearly more than the unseen ones. The
fitted coefficient of ``θ_start`` in (ii) is printed beside the one the optimiser's decay alone gives
(SGD with momentum: the scalar recurrence of its update; Adam: none, its steps are preconditioned).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (exhume, benchmarks), research/practitioner/

OBJECTIVES = ("margin", "loss", "logits")
#: the most memory the K-per-image ``logits`` directions may take (end and start, float64)
LOGITS_BYTES = 2 << 30
FITS = ("i", "0", "ii", "iii")


def objective_fn(name: str, loss: str):
    """``h(Φ, y)``: exhume's margin, or (the negative of) the training loss."""
    from exhume.attacks.stationarity import negative_loss_objective
    from exhume.losses import margin

    if name == "margin":
        return margin
    if name == "loss":
        return negative_loss_objective(loss)
    raise ValueError(f"unknown objective {name!r}; expected one of {OBJECTIVES}")


def trained_names(end: torch.nn.Module, start: torch.nn.Module) -> list[str]:
    """The parameters that training changed (the others, e.g. a frozen trunk, are left out)."""
    s = dict(start.named_parameters())
    return [k for k, v in end.named_parameters() if not torch.equal(v.detach(), s[k].detach())]


def flat(model: torch.nn.Module, names: list[str]) -> torch.Tensor:
    p = dict(model.named_parameters())
    return torch.cat([p[k].detach().reshape(-1) for k in names]).double()


def gradients(model: torch.nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor, objective, block: int = 50) -> torch.Tensor:
    """Per-sample ``∇_θ h(x_i, y_i)`` over the parameters ``names`` (exact ReLU derivative, float64): ``(n, p)``.

    Blocks of ``block`` images through exhume's :func:`~exhume.attacks.stationarity.per_candidate_gradients`.
    """
    from exhume.attacks.stationarity import per_candidate_gradients

    model = model.double().eval()
    params = {k: v.detach() for k, v in model.named_parameters() if k in names}
    params = {k: params[k] for k in names}
    x = x.double()
    y = y.double() if y.is_floating_point() else y
    return torch.cat([per_candidate_gradients(model, params, x[a:a + block], y[a:a + block], objective).detach()
                      for a in range(0, x.shape[0], block)])


def least_squares(blocks: list[torch.Tensor], target: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """``min_c ‖target − Σ_b blocks_bᵀ c_b‖ / ‖target‖`` and the coefficients ``c_b`` (float64).

    Normal equations on unit-norm directions (blocks never concatenated: they can be GBs), a
    pseudo-inverse through the Gram matrix's eigendecomposition, one step of iterative refinement;
    the residual is computed explicitly from the coefficients, so it is the residual they achieve.
    """
    scales = [b.norm(dim=1).clamp_min(1e-300) for b in blocks]
    units = [b / s[:, None] for b, s in zip(blocks, scales)]
    sizes = [u.shape[0] for u in units]
    gram = torch.cat([torch.cat([a @ b.T for b in units], 1) for a in units])
    evals, evecs = torch.linalg.eigh(gram)
    keep = evals > evals.max() * 1e-13
    inv = (evecs[:, keep] / evals[keep]) @ evecs[:, keep].T

    def residual(c: torch.Tensor) -> torch.Tensor:
        return target - sum(u.T @ part for u, part in zip(units, c.split(sizes)))

    c = inv @ torch.cat([u @ target for u in units])
    r = residual(c)
    c = c + inv @ torch.cat([u @ r for u in units])
    r = residual(c)
    return float(r.norm() / target.norm().clamp_min(1e-300)), [part / s for part, s in zip(c.split(sizes), scales)]


def decay_coefficient(training: dict) -> float | None:
    """``a_T − 1`` where ``a`` is ``θ_start``'s share of ``θ`` after the optimiser's decay alone (SGD; None for Adam)."""
    o = training["optimizer"]
    if o["name"] != "sgd":
        return None
    a, v, beta, lr, wd = 1.0, 0.0, o.get("momentum", 0.0), o["lr"], o["weight_decay"]
    for _ in range(training["steps"]):
        v = beta * v + wd * a
        a -= lr * v
    return a - 1.0


def directions(model: torch.nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor, objective: str, loss: str) -> torch.Tensor:
    """Per-sample gradients of ``objective``: ``margin`` or ``loss`` (one row per image), or ``logits`` (K rows per image)."""
    if objective != "logits":
        return gradients(model, names, x, y, objective_fn(objective, loss))
    k = model(x[:1].double()).shape[1]
    return torch.cat([gradients(model, names, x, y, lambda out, _, j=j: out[:, j]) for j in range(k)])


def fits(end, start, names: list[str], theta: torch.Tensor, theta0: torch.Tensor, images: tuple, objective: str, loss: str) -> dict:
    """(i), (ii), (iii) and θ_start's coefficient in (ii) for the images ``(x, y)``."""
    delta = theta - theta0
    g_end = directions(end, names, *images, objective, loss)
    r_i, _ = least_squares([g_end], theta)
    r_ii, c_ii = least_squares([g_end, theta0[None]], delta)
    g_start = directions(start, names, *images, objective, loss)
    r_iii, _ = least_squares([g_end, g_start, theta0[None]], delta)
    return {"i": r_i, "ii": r_ii, "iii": r_iii, "start_coefficient": float(c_ii[1][0])}


def explain_models(end: torch.nn.Module, start: torch.nn.Module, train: tuple, unseen: tuple, loss: str,
                   objectives=OBJECTIVES) -> dict:
    """The fits (i), (0), (ii), (iii) for ``train`` and for ``unseen`` images ``(x, y)`` (model inputs, exhume's labels).

    ``end`` and ``start``: the same architecture at the final and at the starting weights (converted to float64).
    One logit: the loss and the logits give the margin's span (``∇ℓ_i = ℓ'_i·∇margin_i``) and are not refitted.
    ``logits`` (K gradients per image) is skipped (None) where its matrices would exceed ``LOGITS_BYTES``.
    """
    end, start = end.double().eval().requires_grad_(False), start.double().eval().requires_grad_(False)
    names = trained_names(end, start)
    theta, theta0 = flat(end, names), flat(start, names)
    out = {"trained_parameters": int(theta.numel()), "left_out": [k for k, _ in end.named_parameters() if k not in names],
           "n": int(train[0].shape[0]), "n_unseen": int(unseen[0].shape[0]),
           "0": least_squares([theta0[None]], theta - theta0)[0] if float(theta0.norm()) > 0 else 1.0}
    outputs = end(train[0][:1].double()).reshape(1, -1).shape[1]
    for obj in objectives:
        if outputs == 1 and obj != "margin" and "margin" in out:
            out[obj] = {**out["margin"], "same_as": "margin (one logit: the same span)"}
        elif obj == "logits" and 2 * 8 * outputs * out["n"] * out["trained_parameters"] > LOGITS_BYTES:
            out[obj] = None
        else:
            out[obj] = {which: fits(end, start, names, theta, theta0, images, obj, loss)
                        for which, images in (("train", train), ("unseen", unseen))}
    return out


def load_victim(folder: Path) -> tuple[torch.nn.Module, torch.nn.Module, tuple, tuple, dict]:
    """A built victim as exhume sees it: (end, start) wrapped in exhume's conventions, train and n unseen images, training.json."""
    from exhume.audit import load_images, load_model_class, load_weights
    from exhume.victim.wrap import Audited

    t = json.loads((folder / "training.json").read_text())
    spec = f"{folder / 'models.py'}:{t['model']}"
    mean, std = (0.0, 1.0) if t["normalize"] == "none" else t["normalize"]
    head = "logit" if t["task"] == "odd-even" else "logits"

    def wrapped(weights: str) -> torch.nn.Module:
        return Audited(load_weights(load_model_class(spec, t["model_args"]), folder / weights), torch.tensor(std), head)

    def labels(y: np.ndarray) -> torch.Tensor:
        y = torch.from_numpy(np.asarray(y, dtype=np.int64))
        return (2.0 * y - 1.0).double() if head == "logit" else y

    x, y = load_images(folder / "train.npz", need_labels=True)
    ux, uy = load_images(folder / "unseen.npz", need_labels=True)
    n = len(x)
    train = (torch.from_numpy(x) - mean, labels(y))
    unseen = (torch.from_numpy(ux[:n]) - mean, labels(uy[:n]))
    return wrapped("weights.safetensors"), wrapped("start.safetensors"), train, unseen, t


def explain_victim(folder: Path) -> dict:
    end, start, train, unseen, t = load_victim(folder)
    loss = "logistic" if t["task"] == "odd-even" else "cross-entropy"
    res = explain_models(end, start, train, unseen, loss)
    return {"victim": folder.name, "expected_start_coefficient": decay_coefficient(t), **res}


def markdown(rows: list[dict]) -> str:
    """One line per victim and objective: train / unseen residuals of each fit, and θ_start's coefficient."""
    lines = ["| victim | trained params | n | h | (i) θ | (0) start only | (ii) Δ, grads at end + start | (iii) + grads at start "
             "| start coef. fitted / decay alone |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        exp = r["expected_start_coefficient"]
        for obj in OBJECTIVES:
            if r[obj] is None or (obj != "margin" and r[obj].get("same_as")):
                continue
            tr, un = r[obj]["train"], r[obj]["unseen"]
            cells = " | ".join(f"{tr[f]:.3f} / {un[f]:.3f}" for f in ("i",)) + f" | {r['0']:.3f} | " + \
                " | ".join(f"**{tr[f]:.3f}** / {un[f]:.3f}" for f in ("ii", "iii"))
            coef = f"{tr['start_coefficient']:.3g} / " + ("n/a" if exp is None else f"{exp:.3g}")
            lines.append(f"| {r['victim']} | {r['trained_parameters']:,} | {r['n']} | {obj} | {cells} | {coef} |")
    return ("EVALUATOR-SIDE (reads the training set). Relative residual ‖r‖/‖target‖, training images / as many unseen "
            "images (the no-signal baseline); Δ = θ − θ_start; h: the per-sample function differentiated (one-logit "
            "models: the loss and logit rows equal the margin's and are not repeated).\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> int:
    from benchmarks.practitioner.build import ZOO

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", nargs="+", default=None)
    ap.add_argument("--json", default=None, help="write the results here as JSON")
    ap.add_argument("--md", default=None, help="write the markdown table here")
    args = ap.parse_args(argv)
    names = args.only or [s.name for s in ZOO if (Path(args.out) / s.name / "training.json").is_file()]
    rows = []
    for name in names:
        rows.append(explain_victim(Path(args.out) / name))
        print(json.dumps(rows[-1]), flush=True)
    text = markdown(rows)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
