"""The ordinary-CNN zoo (benchmarks/ordinary_cnn/build.py): what training added, one layer up, with the start known.

    python research/ocnn.py spectra VICTIM...                  # W and Δ = W − c·W_0 per layer; EVALUATOR: features' distances
    python research/ocnn.py truth VICTIM... [--equation endpoints]   # EVALUATOR: the known-start equation at the truth
    python research/ocnn.py compare VICTIM --iterations N [--arms weights start stage] [--json OUT]
    python research/ocnn.py oracle VICTIM                      # ORACLE: the true fc features inverted to pixels

One JSON line per victim (and arm). A one-off lab script (research/README.md): not maintained.

- ``spectra`` (attacker-side for the spectra): each weight tensor (``out × in·k·k``) of ``W`` and of ``Δ = W − c·W_0``
  (``c`` from the owner's training settings where they fix it, SGD; else the nuclear norm's minimum, and ``c = 1``):
  σ_n/σ_1, σ_{n+1}/σ_1, the directions holding 99.9 % of the energy. EVALUATOR-SIDE: the training images' features
  at the first ``nn.Linear`` above the convolutions (``φ_T``: through the trained convolutions; ``φ_0``: through the
  start's), and as many unseen images' ``φ_T``, median relative distance to Δ's and W's top-``n`` row spaces.
- ``truth``: EVALUATOR-SIDE: the known-start least-squares residual (exhume.evaluation.residuals.known_start_residual,
  λ ≥ 0 with the margin) of the whole network at the training images against as many unseen images, and of the
  layers from the fc layer up with the features ``φ_T`` in place of images (the stage's equation).
- ``compare``: three arms on equal kkt iterations, one restart each, seed 0, judged by exhume.evaluate's memorisation
  count (pool 1000): ``weights`` (pixel-space kkt, weights only), ``start`` (pixel-space kkt with the owner's start,
  training settings, Adam's state: today's ``--start-weights``), ``stage`` (the prototype: kkt's known-start equation
  on the layers from the fc layer up, features in Δ's top-``k`` row space, ``k`` = n by default; the features inverted
  to pixels through the trained layers below, exhume/attacks/feature_stage.invert); ``span`` / ``spanpool:R[:K]`` (images
  whose fc features lie in Δ's row space, by Adam on pixels, no equation; R such runs pooled by that distance);
  ``spanpen:BETA`` (the ``start`` arm with kkt's ``span_penalty=BETA``: the prototype, class SpanKKT until 26b4f10,
  is now kkt's setting).
- ``oracle``: ORACLE: the training images' ``φ_T`` inverted the same way (how well the layers below invert).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exhume.attacks.kkt import KKTAttack  # noqa: E402
from exhume.attacks.kkt import stage as feature_stage  # noqa: E402
from exhume.attacks.kkt.subspace import Subspace  # noqa: E402
from exhume.equations.trajectory import nuclear_decay  # noqa: E402
from exhume.victim import load_victim  # noqa: E402

ENERGY = 0.999
PENALTY_KEYS = ("span_penalty_used", "span_penalty_rank", "span_penalty_reason")


def owner(folder: Path, victim) -> dict:
    """The threat model's start fields: the start, the owner's training settings and (Adam) its state."""
    settings = json.loads((folder / "training.json").read_text())
    state = folder / "optimizer_state.safetensors"
    return {"start": str(folder / "start.safetensors"), "training": settings,
            "optimizer_state": str(state) if state.is_file() else None}


def owner_view(folder: Path, victim):
    """The attacker's view with the owner's start (as ``exhume attack --start-weights --train-* --optimizer-state``)."""
    from exhume.request import ThreatModel, view_of

    o = owner(folder, victim)
    return view_of(victim, ThreatModel(start=o["start"], training=o["training"], optimizer_state=o["optimizer_state"]))


def fc_layer(model: nn.Module) -> str:
    """The first nn.Linear: the layer after the convolutions."""
    return next(k for k, m in model.named_modules() if isinstance(m, nn.Linear))


def decay_of(view, name: str, n: int) -> tuple[float, str]:
    c = view.training.decay(n) if view.training is not None else None
    if c is not None:
        return float(c), "training settings"
    w = dict(view.model.named_parameters())[name]
    return nuclear_decay(w.reshape(w.shape[0], -1), view.start[name].reshape(w.shape[0], -1)), "nuclear norm"


def spectrum(mat: torch.Tensor, n: int) -> dict:
    s = torch.linalg.svdvals(mat.double())
    e = (s ** 2).cumsum(0) / (s ** 2).sum().clamp_min(1e-300)
    out = {"rank_999": int((e < ENERGY).sum()) + 1, "directions": int(s.numel())}
    if n <= s.numel():
        out["sigma_n"] = float(s[n - 1] / s[0])
    if n < s.numel():
        out["sigma_after_n"] = float(s[n] / s[0])
    return out


def top_rows(mat: torch.Tensor, k: int) -> torch.Tensor:
    """The top-``k`` right singular vectors of ``mat`` (columns)."""
    return torch.linalg.svd(mat.double(), full_matrices=False)[2][:k].T


def distance(rows: torch.Tensor, basis: torch.Tensor) -> float:
    rows = rows.double()
    rows = rows[rows.norm(dim=1) > 0]
    d = (rows - rows @ basis @ basis.T).norm(dim=1) / rows.norm(dim=1)
    return float(d.median())


def start_model(victim, view) -> nn.Module:
    m = copy.deepcopy(victim.model)
    m.load_state_dict({**m.state_dict(), **{k: v.to(m.state_dict()[k]) for k, v in view.start.items()}})
    return m.eval()


def unseen_set(victim, count: int):
    """``count`` unseen images as exhume.evaluate draws its pool (seed 1), as TaskData."""
    from exhume.data import dataset_of, make_pool

    ds = dataset_of(victim.data_spec)
    train = victim.load_train_set(ds)
    return train, make_pool(ds, train.spec["task"], count, exclude=train.indices, seed=1)


def cmd_spectra(folder: Path) -> dict:
    victim = load_victim(folder)
    view = owner_view(folder, victim)
    n = len(victim.train_indices)
    row = {"victim": folder.name, "n": n, "layers": {}}
    params = dict(victim.model.named_parameters())
    for name, w in params.items():
        if w.dim() < 2:
            continue
        w0 = view.start[name]
        if torch.equal(w0, w):
            row["layers"][name] = {"frozen": True, "W": spectrum(w.reshape(w.shape[0], -1).detach(), n)}
            continue
        c, rule = decay_of(view, name, n)
        mat, mat0 = w.detach().reshape(w.shape[0], -1), w0.reshape(w.shape[0], -1)
        row["layers"][name] = {"W": spectrum(mat, n), "delta_c1": spectrum(mat - mat0, n), "c": c, "c_rule": rule,
                               "delta": spectrum(mat - c * mat0, n), "delta_norm_share": float((mat - c * mat0).norm() / mat.norm())}
        moment = view.training.second_moment if view.training is not None else None
        if moment is not None and name in moment:  # Adam: what training added, preconditioned back (P = √v̂ + ε)
            s2 = view.training
            p = (moment[name].div(1.0 - s2.betas[1] ** s2.adam_step).sqrt() + s2.eps).reshape(mat.shape)
            cp = nuclear_decay(p * mat, p * mat0)
            row["layers"][name].update(c_P=cp, delta_P=spectrum(p * (mat - cp * mat0), n))
    fc = fc_layer(victim.model)
    train, unseen = unseen_set(victim, n)
    x, xu = train.centred.float(), (unseen.x - train.mean).float()
    with torch.no_grad():
        f_t = feature_stage.features_of(victim.model, fc, x)
        f_0 = feature_stage.features_of(start_model(victim, view), fc, x)
        f_u = feature_stage.features_of(victim.model, fc, xu)
    w, w0 = params[f"{fc}.weight"].detach(), view.start[f"{fc}.weight"]
    c = row["layers"][f"{fc}.weight"].get("c", 1.0)
    k = min(n, min(w.shape) - 1)
    bases = {"delta": top_rows(w - c * w0, k), "W": top_rows(w, k)}
    moment = view.training.second_moment if view.training is not None else None
    if moment is not None and f"{fc}.weight" in moment:
        s2, cp = view.training, row["layers"][f"{fc}.weight"]["c_P"]
        p = moment[f"{fc}.weight"].div(1.0 - s2.betas[1] ** s2.adam_step).sqrt() + s2.eps
        bases["delta_P"] = top_rows(p * (w - cp * w0), k)
    row["fc"] = fc
    row["features_EVALUATOR"] = {f"{what}_to_{b}": distance(f, basis) for b, basis in bases.items()
                                 for what, f in (("train_T", f_t), ("train_0", f_0), ("unseen_T", f_u))}
    row["features_EVALUATOR"]["train_moved"] = float(((f_t - f_0).norm(dim=1) / f_t.norm(dim=1)).median())
    return row



def above_view(victim, view, scale: float | None = None):
    """The view of the layers from the fc layer up, its inputs the (scaled) features, with the start of those layers."""
    fc = fc_layer(victim.model)
    gen = torch.Generator().manual_seed(0)
    probe = torch.rand((feature_stage.PROBES, *victim.input_shape), generator=gen, dtype=torch.float64) - victim.mean.double()
    with torch.no_grad():
        scale = scale or float(feature_stage.features_of(victim.model, fc, probe.float()).max())
    above = feature_stage.Above(victim.model, fc, tuple(victim.input_shape), scale)
    names = {k for k, _ in above.named_parameters()}
    start = {f"net.{k}": v for k, v in view.start.items() if f"net.{k}" in names}
    training = view.training
    if training is not None and training.second_moment is not None:
        training = replace(training, second_moment={f"net.{k}": v for k, v in training.second_moment.items() if f"net.{k}" in names})
    d = victim.model.get_submodule(fc).in_features
    fview = replace(view, model=above, input_shape=(d,), mean=torch.zeros(d), start=start, training=training)
    return fview, above, fc


def cmd_truth(folder: Path, equation: str) -> dict:
    from exhume.evaluation.residuals import known_start_residual

    victim = load_victim(folder)
    view = owner_view(folder, victim)
    n = len(victim.train_indices)
    train, unseen = unseen_set(victim, n)
    x, xu = train.centred.float(), (unseen.x - train.mean).float()
    row = {"victim": folder.name, "n": n, "equation": equation}
    t0 = time.perf_counter()
    row["image_train"] = known_start_residual(view, x, train.y, equation)["value"]
    row["image_unseen"] = known_start_residual(view, xu, unseen.y, equation)["value"]
    fview, above, fc = above_view(victim, view)
    with torch.no_grad():
        f_t = feature_stage.features_of(victim.model, fc, x) / above.scale
        f_u = feature_stage.features_of(victim.model, fc, xu) / above.scale
    row["features_train"] = known_start_residual(fview, f_t, train.y, equation)["value"]
    row["features_unseen"] = known_start_residual(fview, f_u, unseen.y, equation)["value"]
    if equation == "endpoints":  # the features each point really saw: φ_0 (the start's layers below) at θ_0, φ_T at θ_T
        below = start_model(victim, view)
        with torch.no_grad():
            f_0 = feature_stage.features_of(below, fc, x) / above.scale
            f_u0 = feature_stage.features_of(below, fc, xu) / above.scale
        row["features_own_train"] = two_feature_residual(fview, f_0, f_t, train.y)
        row["features_own_unseen"] = two_feature_residual(fview, f_u0, f_u, unseen.y)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def two_feature_residual(fview, f_0: torch.Tensor, f_t: torch.Tensor, y: torch.Tensor) -> float:
    """The endpoints equation of the layers above with features ``f_0`` at the start point and ``f_t`` at the final
    one (λ ≥ 0, the margin, c as the audit's): what the stage would fit if it modelled the features' move."""
    from exhume.equations.formulation import resolve
    from exhume.equations.stationarity import least_squares
    from exhume.equations.trajectory import StartEquation, build_equation, per_sample
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(fview.model, "cpu", torch.float64)
    eq = build_equation(fview, model, params, "endpoints", len(f_t))
    form = resolve(fview, model, "auto", 1.0, params, len(f_t), len(f_t), torch.float64)
    rows = [per_sample(model, StartEquation(eq.names, [p], eq.target, None, eq.norm2), f.double(), y, form.objective)
            for p, f in zip(eq.points, (f_0, f_t))]
    J = torch.cat(rows).double()
    t = torch.cat([eq.target[k].reshape(-1) for k in eq.names]).double()
    if eq.direction is not None:
        J = torch.cat([J, torch.cat([eq.direction[k].reshape(-1) for k in eq.names]).double()[None]])
    coef = least_squares(J, t, True, free=int(eq.direction is not None))
    rest = t - J.T @ coef
    return float(rest @ rest) / eq.norm2


def segment_residual(fview, f: torch.Tensor, y: torch.Tensor, points: int, nonnegative: bool) -> float:
    """The stage's equation with gradients at ``points`` evenly spaced points of the segment θ_0 → θ_T (2: endpoints)."""
    from exhume.equations.formulation import resolve
    from exhume.equations.stationarity import least_squares
    from exhume.equations.trajectory import StartEquation, build_equation, per_sample
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(fview.model, "cpu", torch.float64)
    eq = build_equation(fview, model, params, "endpoints", len(f))
    form = resolve(fview, model, "auto", 1.0, params, len(f), len(f), torch.float64)
    a, b = eq.points
    segment = [{k: a[k] + (b[k] - a[k]) * (i / (points - 1)) for k in b} for i in range(points)] if points > 1 else [b]
    J = torch.cat([per_sample(model, StartEquation(eq.names, [q], eq.target, None, eq.norm2), f.double(), y, form.objective)
                   for q in segment]).double()
    t = torch.cat([eq.target[k].reshape(-1) for k in eq.names]).double()
    if eq.direction is not None:
        J = torch.cat([J, torch.cat([eq.direction[k].reshape(-1) for k in eq.names]).double()[None]])
    coef = least_squares(J, t, nonnegative, free=int(eq.direction is not None))
    rest = t - J.T @ coef
    return float(rest @ rest) / eq.norm2


def cmd_points(folder: Path) -> dict:
    victim = load_victim(folder)
    view = owner_view(folder, victim)
    n = len(victim.train_indices)
    train, unseen = unseen_set(victim, n)
    fview, above, fc = above_view(victim, view)
    with torch.no_grad():
        f_t = feature_stage.features_of(victim.model, fc, train.centred.float()) / above.scale
        f_u = feature_stage.features_of(victim.model, fc, (unseen.x - train.mean).float()) / above.scale
    row = {"victim": folder.name}
    for k in (1, 2, 3, 5):
        for sign in (True, False):
            key = f"points{k}_{'nonneg' if sign else 'signed'}"
            row[key] = [round(segment_residual(fview, f, yy, k, sign), 4) for f, yy in ((f_t, train.y), (f_u, unseen.y))]
        print(json.dumps(row), flush=True)
    return row


class StageKKT(KKTAttack):
    """kkt whose span is given: Δ's top-k row space at the fc layer (the prototype's gate and row space)."""

    basis: torch.Tensor | None = None
    span_info: dict = {}

    def span(self, view, model, params, n, eq, x):
        sub = Subspace(self.basis.to(x), dict(self.span_info))
        with torch.no_grad():
            x.copy_(sub.project(x))
        return sub


def stage_setup(victim, view, fview, above, fc: str, basis: torch.Tensor, equation: str, seed: int, m: int):
    """Attacker-side: the multiplier scale S = ‖target‖/(γ·√n), γ the gradient norm at the features of pixel probe
    images drawn from the data mean (trajectory.probe_images, pushed through the trained layers below), and the
    starting candidates: those probes' mean feature projected onto the row space, plus kkt's init noise."""
    from exhume.equations.formulation import resolve
    from exhume.equations.trajectory import StartEquation, build_equation, per_sample, probe_images
    from exhume.equations.workcopy import attack_model

    n = len(victim.train_indices)
    model, params = attack_model(fview.model, "cpu", torch.float32)
    eq = build_equation(fview, model, params, equation, n)
    form = resolve(fview, model, "auto", 1.0, params, n, m, torch.float32)
    with torch.no_grad():
        probes = feature_stage.features_of(victim.model, fc, probe_images(victim.mean.float(), 64)) / above.scale
    last = StartEquation(eq.names, eq.points[-1:], eq.target, None, eq.norm2)
    labels = form.labels.repeat(math.ceil(64 / m))[:64]
    rows = per_sample(model, last, probes[:64], labels, form.objective)
    gamma = float(rows.double().pow(2).sum(1).mean().sqrt())
    scale = math.sqrt(eq.norm2) / (gamma * math.sqrt(n))
    centre = probes.mean(0).double()
    centre = (basis.double() @ (basis.double().T @ centre)).float()
    gen = torch.Generator().manual_seed(seed)
    init = centre[None] + 1.7e-3 * torch.randn((m, centre.numel()), generator=gen)
    return scale, init, {"probe_gradient_norm": gamma, "lambda_scale": scale, "probe_feature_norm": float(probes.norm(dim=1).median())}


def stage_attack(folder: Path, victim, view, iterations: int, seed: int, rank: int | None, equation: str, **kw):
    """The known-start feature stage (prototype): returns (Reconstruction in pixel space, info)."""
    fview, above, fc = above_view(victim, view)
    n = len(victim.train_indices)
    w, w0 = dict(victim.model.named_parameters())[f"{fc}.weight"].detach(), view.start[f"{fc}.weight"]
    c, rule = decay_of(view, f"{fc}.weight", n)
    k = rank or min(n, min(w.shape) - 1)
    basis = top_rows(w - c * w0, k).float()
    m = kw.pop("m", n)
    oracle_init = kw.pop("oracle_init", False)
    scale, init, setup = stage_setup(victim, view, fview, above, fc, basis, equation, seed, m)
    if oracle_init:  # ORACLE: start the stage at the training images' own features (does the attack stay there?)
        with torch.no_grad():
            init = feature_stage.features_of(victim.model, fc, victim.train_set.centred.float()) / above.scale
        setup["init"] = "ORACLE: the training images' features"
    attack = StageKKT(iterations=iterations, start_equation=equation, background=0.0, m=m, lambda_scale=scale, **kw)
    attack.basis = basis
    attack.span_info = {"subspace_used": "delta top-k", "subspace_rank": k, "subspace_layer": f"{fc}.weight",
                        "subspace_start_decay": c, "subspace_start_decay_rule": rule}
    t0 = time.perf_counter()
    stage = attack.run(fview, seed=seed, progress=False, init=init, init_name="probe mean feature")
    t1 = time.perf_counter()
    target = stage.candidates.reshape(stage.candidates.shape[0], -1).float() * above.scale
    images, inv = feature_stage.invert(victim.model, fc, target, victim.mean.float(), seed)
    info = {"stage_seconds": round(t1 - t0, 1), "stage_iterations": stage.record.iterations, "rank": k, **setup, **inv,
            "stage_residual": stage.record.final_relative_stationarity, "candidate_feature_norm": float(target.norm(dim=1).median()),
            "inversion_seconds_total": round(time.perf_counter() - t1, 1)}
    recon = replace(stage, candidates=images.float().cpu())
    return recon, info


def span_images(victim, view, steps: int, seed: int, rank: int | None, lr: float = 0.02, below: str = "trained"):
    """Images whose features at the fc layer lie in Δ's top-k row space: Adam on pixels (display prior [0, 1]) on
    Σ_j dist(φ(x_j), span)² / ‖φ(x_j)‖², n candidates from noise around the data mean. No equation: the span alone."""
    fc = fc_layer(victim.model)
    n = len(victim.train_indices)
    w, w0 = dict(victim.model.named_parameters())[f"{fc}.weight"].detach(), view.start[f"{fc}.weight"]
    c, _ = decay_of(view, f"{fc}.weight", n)
    k = rank or min(n, min(w.shape) - 1)
    basis = top_rows(w - c * w0, k).float()
    model = copy.deepcopy(victim.model) if below == "trained" else start_model(victim, view)
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    mean = victim.mean.float()
    x = (torch.rand((n, *mean.shape), generator=gen) - mean).requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        f = feature_stage.features_of(model, fc, x)
        out = f - (f @ basis) @ basis.T
        v = x + mean
        loss = (out.pow(2).sum(1) / f.pow(2).sum(1).clamp_min(1e-12)).sum() + (torch.relu(v - 1) ** 2 + torch.relu(-v) ** 2).sum()
        loss.backward()
        opt.step()
    with torch.no_grad():
        f = feature_stage.features_of(model, fc, x)
        d = ((f - (f @ basis) @ basis.T).norm(dim=1) / f.norm(dim=1))
    from exhume.attacks.engine.base import Reconstruction
    from exhume.attacks.engine.record import RunRecord

    seconds = time.perf_counter() - t0
    recon = Reconstruction(method="inversion", candidates=(x.detach() + mean).float(), labels=torch.zeros(n), scores=None,
                           record=RunRecord(iterations=steps, seconds=round(seconds, 1)), seed=seed)
    return recon, {"span_distance_median": float(d.median()), "rank": k, "below": below, "steps": steps, "seconds": round(seconds, 1),
                   "basis": basis}


def span_pool(victim, view, steps: int, seed: int, rank: int | None, rounds: int, keep: int | None = None):
    """``rounds`` runs of :func:`span_images` (seeds ``seed``, ``seed + 1``, ...) pooled: the ``keep`` (default n) candidates
    whose features lie closest to Δ's row space (an attacker-side score: weights and start only)."""
    from exhume.attacks.engine.base import Reconstruction
    from exhume.attacks.engine.record import RunRecord

    n = len(victim.train_indices)
    fc = fc_layer(victim.model)
    cands, dists, t0 = [], [], time.perf_counter()
    for r in range(rounds):
        recon, info = span_images(victim, view, steps, seed + r, rank)
        basis = info.pop("basis")
        with torch.no_grad():
            f = feature_stage.features_of(victim.model, fc, recon.candidates - victim.mean)
            d = (f - (f @ basis) @ basis.T).norm(dim=1) / f.norm(dim=1)
        cands.append(recon.candidates)
        dists.append(d)
    x, d = torch.cat(cands), torch.cat(dists)
    order = d.argsort()[: keep or n]
    recon = Reconstruction(method="inversion", candidates=x[order], labels=torch.zeros(len(order)), scores=-d[order], seed=seed,
                           record=RunRecord(iterations=steps * rounds, seconds=round(time.perf_counter() - t0, 1)))
    q = [float(v) for v in torch.quantile(d, torch.tensor([0.01, 0.05, 0.1, 0.5]))]
    return recon, {"rounds": rounds, "steps": steps, "pooled": len(d), "kept": len(order), "distance_q01_q05_q10_q50": q,
                   "kept_distance_max": float(d[order].max())}


def judge(recon, victim) -> dict:
    import exhume

    m = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
    return {"memorised": m.memorised, "control": m.memorised_control, "control_oracle": m.memorised_control_oracle,
            "one_to_one_0.4": m.one_to_one_at.get(0.4), "verdict": m.verdict, "p": m.p_value}


def cmd_compare(folder: Path, iterations: int, arms: list[str], seed: int, rank: int | None, equation: str, params: dict,
                save: str | None = None) -> list[dict]:
    import exhume

    torch.set_num_threads(1)
    victim = load_victim(folder)
    view = owner_view(folder, victim)
    rows = []
    for arm in arms:
        t0 = time.perf_counter()
        info: dict = {}
        if arm == "weights":
            recon = exhume.attack(victim, method="kkt", seed=seed, restarts=1, iterations=iterations, progress=False, **params)
        elif arm == "start":
            recon = exhume.attack(view, method="kkt", seed=seed, restarts=1, iterations=iterations, progress=False, **params)
        elif arm in ("span", "span-start"):  # span, span-start: the span alone (features through the trained / start layers)
            recon, info = span_images(victim, view, iterations, seed, rank, below="start" if arm == "span-start" else "trained")
            info.pop("basis")
        elif arm.startswith("spanpool"):  # spanpool:ROUNDS[:KEEP]
            bits = arm.split(":")
            recon, info = span_pool(victim, view, iterations, seed, rank, int(bits[1]), int(bits[2]) if len(bits) > 2 else None)
        elif arm.startswith("spanpen"):  # spanpen:BETA: the start arm with kkt's span_penalty=BETA (in the package since 26b4f10)
            kw = {**params, "span_penalty": float(arm.split(":")[1])}
            recon = exhume.attack(view, method="kkt", seed=seed, restarts=1, iterations=iterations, progress=False, **kw)
        elif arm == "stage":
            recon, info = stage_attack(folder, victim, view, iterations, seed, rank, equation, **params)
        else:
            raise SystemExit(f"unknown arm {arm!r}")
        seconds = time.perf_counter() - t0
        if save:
            Path(save).mkdir(parents=True, exist_ok=True)
            torch.save(recon.candidates.float(), Path(save) / f"{folder.name}__{arm.replace(':', '-')}__s{seed}.pt")
        rec = recon.record
        row = {"victim": folder.name, "arm": arm, "params": params, "seed": seed, "iterations": rec.iterations, "seconds": round(seconds, 1),
               **{k: v for k, v in rec.settings.items() if k.startswith("span_penalty") and k in PENALTY_KEYS},
               "residual": rec.final_relative_stationarity, **info, **judge(recon, victim)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def cmd_pool(folder: Path, files: list[str]) -> dict:
    """The candidates of several runs judged as one pool (as the portfolio pools its restarts, without its merge)."""
    from exhume.attacks.engine.base import Reconstruction
    from exhume.attacks.engine.record import RunRecord

    victim = load_victim(folder)
    x = torch.cat([torch.load(f) for f in files])
    recon = Reconstruction(method="inversion", candidates=x, labels=torch.zeros(len(x)), scores=None, seed=0,
                           record=RunRecord(iterations=0, seconds=0.0))
    return {"victim": folder.name, "runs": len(files), "candidates": len(x), **judge(recon, victim)}


def cmd_oracle(folder: Path, steps: int | None) -> dict:
    victim = load_victim(folder)
    fc = fc_layer(victim.model)
    train = victim.train_set
    with torch.no_grad():
        target = feature_stage.features_of(victim.model, fc, train.centred.float())
    t0 = time.perf_counter()
    if steps:
        feature_stage.INVERT_STEPS = steps
    images, inv = feature_stage.invert(victim.model, fc, target, victim.mean.float(), 0)
    from exhume.attacks.engine.base import Reconstruction
    from exhume.attacks.engine.record import RunRecord

    recon = Reconstruction(method="inversion", candidates=images.float(), labels=train.y, scores=None,
                           record=RunRecord(iterations=inv["inversion_steps"], seconds=round(time.perf_counter() - t0, 1)), seed=0)
    return {"victim": folder.name, "ORACLE": "the training images' true features inverted", **inv, **judge(recon, victim)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=("spectra", "truth", "compare", "oracle", "points", "pool"))
    ap.add_argument("victims", nargs="+")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--arms", nargs="+", default=["weights", "start", "stage"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=None, help="the stage's row space: Δ's top-k (default n)")
    ap.add_argument("--equation", default="endpoints", choices=("endpoints", "trajectory"))
    ap.add_argument("--steps", type=int, default=None, help="oracle: inversion steps")
    ap.add_argument("--save", default=None, help="compare: save each arm's candidates (display space) in this folder")
    ap.add_argument("--files", nargs="*", default=[], help="pool: candidate files saved by compare --save, judged together")
    ap.add_argument("-p", action="append", default=[], help="kkt setting KEY=JSON for every arm")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    params = {k: json.loads(v) for k, v in (p.split("=", 1) for p in args.p)}
    for v in args.victims:
        folder = Path(v)
        if args.cmd == "spectra":
            print(json.dumps(cmd_spectra(folder)), flush=True)
        elif args.cmd == "truth":
            print(json.dumps(cmd_truth(folder, args.equation)), flush=True)
        elif args.cmd == "pool":
            print(json.dumps(cmd_pool(folder, args.files)), flush=True)
        elif args.cmd == "points":
            cmd_points(folder)
        elif args.cmd == "compare":
            cmd_compare(folder, args.iterations, args.arms, args.seed, args.rank, args.equation, params, args.save)
        else:
            print(json.dumps(cmd_oracle(folder, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
