"""Membership exposure from the weights: can someone holding the model tell that a record was trained on?

Not :mod:`exhume.evaluation.membership` (whether the *reconstructions* single out training images):
here each record ``(x, y)`` gets a score from the model itself, higher meaning "member", computed the
same way for the owner's training images (members) and for unseen images (non-members):

- ``loss``: ``−ℓ(x; θ_T)``, the record's loss (black box: the standard loss attack);
- ``loss_drop`` (start known): ``ℓ(x; θ_0) − ℓ(x; θ_T)``, the start as a reference model;
- ``gradient_alignment`` (white box): ``cos(−∇_θ ℓ(x; θ_T), t)`` with ``t`` what the threat model's
  equation explains (:func:`exhume.equations.trajectory.build_equation`): the weights ``θ_T``
  weights only (at a stationary point ``θ_T = (1/(n·w)) Σ_i −∇_θ ℓ_i``), ``P ⊙ (θ_T − c·θ_0)``
  with the start (what training added, Adam-preconditioned where its state is given, frozen
  parameters left out); each member's own gradient is a term of that sum;
- ``gradient_alignment_start`` (start known): the same with the gradient at the start ``θ_0``.

Per-record gradients are ``torch.func.vmap`` over ``grad`` of ``functional_call``: any module.
For each score: ROC AUC, TPR at 1 % and 0.1 % FPR (the threshold above all but ``⌊f·N⌋`` of the
``N`` non-members, so with ``N < 1000`` the 0.1 % figure is TPR at no false positive), each with a
95 % percentile bootstrap interval (members and non-members resampled separately, seeded). The
finding is the primary white-box score, ``gradient_alignment``, fixed in advance (not the best of
the four, which would be chosen by looking at the members): is its TPR at 1 % FPR above 1 %, its
interval's lower bound above 1 %? Unseen images without labels are scored with the model's own
predictions, which favours them (understates the exposure; ``nonmember_labels`` says so).
Measurements: docs/defaults.md#audit-membership.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from exhume.evaluation.membership import auc_mann_whitney
from exhume.losses import per_sample_loss

PRIMARY = "gradient_alignment"
FPRS = (0.01, 0.001)
BOOTSTRAP = 1000
BATCH_BYTES = 1 << 28  # per-record gradients held at once (float64): 32 records, fewer for a large model
SCORE_TEXT = {"loss": "−ℓ(x; θ_T): the record's loss (black box)",
              "loss_drop": "ℓ(x; θ_0) − ℓ(x; θ_T): the start as reference model",
              "gradient_alignment": "cos(−∇θ ℓ(x; θ_T), t), t = θ_T (weights only) or P⊙(θ_T − c·θ_0) (start known)",
              "gradient_alignment_start": "cos(−∇θ ℓ(x; θ_0), t), the gradient at the start"}


def _target(view, model, params, n_train: int) -> tuple[Any, str]:
    """What the threat model's equation explains (its parameters, the target ``t``) and its description."""
    from exhume.equations.kinds import SolvedEquation
    from exhume.equations.trajectory import build_equation

    equation = SolvedEquation.TRAJECTORY if view.start is None else SolvedEquation.ENDPOINTS
    eq = build_equation(view, model, params, equation.value, n_train)
    return eq, eq.info.get("preconditioner", "")


def _record_scores(model, point: dict, names, t: torch.Tensor, loss: str, x: torch.Tensor, y: torch.Tensor):
    """``(−ℓ, cos(−∇ℓ, t))`` per record at the parameters ``point`` (batches of at most ``BATCH_BYTES`` of gradients)."""
    rest = {k: v for k, v in point.items() if k not in names}

    def one(xi, yi):
        def neg(sub):
            out = functional_call(model, {**rest, **sub}, (xi[None],))
            return -per_sample_loss(loss, out, yi[None]).sum()

        g = grad(neg)({k: point[k] for k in names})
        return torch.cat([g[k].reshape(-1) for k in names])

    losses, cosines = [], []
    tn = t / t.norm().clamp_min(1e-300)
    batch = max(1, min(32, BATCH_BYTES // (8 * t.numel())))
    for s in range(0, len(x), batch):
        xb, yb = x[s:s + batch], y[s:s + batch]
        with torch.no_grad():
            losses.append(-per_sample_loss(loss, functional_call(model, point, (xb,)), yb))
        g = vmap(one)(xb, yb)
        cosines.append((g @ tn) / g.norm(dim=1).clamp_min(1e-300))
    return torch.cat(losses).numpy(), torch.cat(cosines).numpy()


def membership_scores(view, x: torch.Tensor, y: torch.Tensor, n_train: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every score of the module docstring for records ``x`` (as the view's model takes them) with labels ``y``;
    ``n_train``: the training set's size (where the training settings give the start's decay by epochs)."""
    from exhume.equations.trajectory import _project
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(view.model, "cpu", torch.float64)
    eq, precond = _target(view, model, params, n_train)
    target = eq.target if view.start is None else _project(eq, eq.target)  # c fitted: t is projected off P⊙θ_0
    t = torch.cat([target[k].reshape(-1) for k in eq.names])
    x, y = x.double(), (y.double() if y.is_floating_point() else y)
    end_loss, end_cos = _record_scores(model, eq.points[-1], eq.names, t, view.loss, x, y)
    scores = {"loss": end_loss, "gradient_alignment": end_cos}
    if view.start is not None:
        start_loss, start_cos = _record_scores(model, eq.points[0], eq.names, t, view.loss, x, y)
        scores.update(loss_drop=end_loss - start_loss, gradient_alignment_start=start_cos)
    info = {"target": "P⊙(θ_T − c·θ_0)" if view.start is not None else "θ_T", "preconditioner": precond,
            "start_decay": eq.info.get("start_decay"), "parameters": int(t.numel())}
    return scores, info


def tpr_at(pos: np.ndarray, neg: np.ndarray, fpr: float) -> float:
    """The share of ``pos`` strictly above the threshold that ``⌊fpr·N⌋`` of the ``N`` ``neg`` scores exceed."""
    allowed = int(np.floor(fpr * len(neg) + 1e-9))
    threshold = np.sort(neg)[::-1][allowed] if allowed < len(neg) else -np.inf
    return float(np.mean(pos > threshold))


def _boot_stats(pos: np.ndarray, neg: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """``[AUC, TPR at each of FPRS]`` of every resample ``(pos[ia[b]], neg[ib[b]])`` at once, equal to
    :func:`auc_mann_whitney` and :func:`tpr_at` on each (tests/test_owner_findings.py): the AUC from the
    count of (member, non-member) pairs ordered right (ties ½), exact in float64 as the rank sum is."""
    b, rows = len(ia), np.arange(len(ia))[:, None]
    ca = np.bincount((ia + len(pos) * rows).ravel(), minlength=b * len(pos)).reshape(b, len(pos))
    cb = np.bincount((ib + len(neg) * rows).ravel(), minlength=b * len(neg)).reshape(b, len(neg))
    order = np.argsort(neg, kind="stable")
    cum = np.concatenate([np.zeros((b, 1)), np.cumsum(cb[:, order], axis=1, dtype=float)], axis=1)  # resampled negs among the k lowest
    below, upto = cum[:, np.searchsorted(neg[order], pos, "left")], cum[:, np.searchsorted(neg[order], pos, "right")]
    out = [(ca * (below + 0.5 * (upto - below))).sum(1) / (ia.shape[1] * ib.shape[1])]
    desc = np.sort(neg[ib], axis=1)[:, ::-1]
    for f in FPRS:
        allowed = int(np.floor(f * ib.shape[1] + 1e-9))
        threshold = desc[:, allowed] if allowed < ib.shape[1] else np.full(b, -np.inf)
        out.append(np.mean(pos[ia] > threshold[:, None], axis=1))
    return np.stack(out, axis=1)


def roc_summary(pos: np.ndarray, neg: np.ndarray, seed: int = 0, resamples: int = BOOTSTRAP) -> dict[str, Any]:
    """AUC and TPR at ``FPRS`` with 95 % percentile bootstrap intervals (see the module docstring)."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    rng = np.random.default_rng(seed)
    point = [auc_mann_whitney(pos, neg)] + [tpr_at(pos, neg, f) for f in FPRS]
    draws = [(rng.integers(0, len(pos), len(pos)), rng.integers(0, len(neg), len(neg))) for _ in range(resamples)]
    ia, ib = np.array([a for a, _ in draws]), np.array([c for _, c in draws])
    step = max(1, (1 << 22) // (len(pos) + len(neg)))  # resamples per batch: a few 10 MB at most
    boot = np.concatenate([_boot_stats(pos, neg, ia[i:i + step], ib[i:i + step]) for i in range(0, resamples, step)])
    lo, hi = np.percentile(boot, 2.5, axis=0), np.percentile(boot, 97.5, axis=0)
    keys = ["auc"] + [f"tpr_at_{f:g}_fpr" for f in FPRS]
    return {k: {"value": point[i], "ci95": [float(lo[i]), float(hi[i])]} for i, k in enumerate(keys)}


def roc_curve(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every threshold, from the highest score down."""
    scores = np.concatenate([pos, neg])
    member = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    order = np.argsort(-scores, kind="stable")
    tp, fp = np.cumsum(member[order]), np.cumsum(1 - member[order])
    return np.concatenate([[0.0], fp / len(neg)]), np.concatenate([[0.0], tp / len(pos)])


def membership_exposure(view, members: torch.Tensor, member_labels: torch.Tensor, nonmembers: torch.Tensor,
                        nonmember_labels: torch.Tensor | None = None, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``membership_exposure`` record of metrics.json and the per-record scores (``{score}_members``,
    ``{score}_nonmembers``); records as the view's model takes them (centred), exhume's labels."""
    labels_given = nonmember_labels is not None
    if not labels_given:
        with torch.no_grad():
            out = view.model(nonmembers.to(next(view.model.parameters()).dtype))
        nonmember_labels = out.argmax(1) if view.task == "multiclass" else torch.where(out.reshape(-1) >= 0, 1.0, -1.0)
    pos, info = membership_scores(view, members, member_labels, len(members))
    neg, _ = membership_scores(view, nonmembers, nonmember_labels.to(member_labels.dtype), len(members))
    per = {name: {**roc_summary(pos[name], neg[name], seed), "definition": SCORE_TEXT[name]} for name in pos}
    tpr = per[PRIMARY]["tpr_at_0.01_fpr"]
    record = {"scores": per, "primary": PRIMARY, "n_members": len(members), "n_nonmembers": len(nonmembers),
              "nonmember_labels": "given" if labels_given else "the model's predictions (no labels given): favours the "
                                  "non-members, so the exposure is understated",
              "lowest_fpr_resolved": 1.0 / len(nonmembers), "bootstrap": f"{BOOTSTRAP} resamples, seed {seed}, 95 % percentile",
              "exposed": bool(tpr["ci95"][0] > 0.01), **info}
    record["finding"] = finding_line(record)
    arrays = {f"{k}_members": v for k, v in pos.items()} | {f"{k}_nonmembers": v for k, v in neg.items()}
    return record, arrays


def _pct(v: float) -> str:
    return f"{100 * v:.3g} %"


def finding_line(record: dict[str, Any]) -> str:
    """The one-line finding: the primary score's TPR at 1 % FPR with its interval, beside the record's loss."""
    s = record["scores"]
    main, base = s[PRIMARY]["tpr_at_0.01_fpr"], s["loss"]["tpr_at_0.01_fpr"]
    lo, hi = main["ci95"]
    verdict = ("above 1 %: the weights expose membership" if record["exposed"]
               else "not above 1 % with confidence: no membership exposure shown by this score")
    return (f"Membership from the weights: gradient alignment flags {_pct(main['value'])} of training images at 1 % false "
            f"positives (95 % CI {_pct(lo)}–{_pct(hi)}; AUC {s[PRIMARY]['auc']['value']:.2f}), the record's loss alone "
            f"{_pct(base['value'])}; {verdict} ({record['n_members']} members, {record['n_nonmembers']} unseen images).")


def plot_roc(arrays: dict[str, np.ndarray], path: str | Path) -> Path:
    """The ROC of every score on log–log axes (membership-inference papers' plot), chance as the diagonal."""
    from exhume.evaluation.plots import save_figure, subplots

    fig, ax = subplots(figsize=(4.6, 4.2))
    names = [k[: -len("_members")] for k in arrays if k.endswith("_members")]
    floor = 1.0
    for name in names:
        fpr, tpr = roc_curve(arrays[f"{name}_members"], arrays[f"{name}_nonmembers"])
        floor = min(floor, 1.0 / len(arrays[f"{name}_nonmembers"]))
        ax.step(np.maximum(fpr, 1e-5), np.maximum(tpr, 1e-5), where="post", label=name, lw=2 if name == PRIMARY else 1)
    ax.plot([1e-5, 1], [1e-5, 1], ls=":", c="gray", label="chance")
    ax.set(xscale="log", yscale="log", xlim=(floor / 2, 1), ylim=(floor / 2, 1.05), xlabel="false positive rate",
           ylabel="true positive rate", title="membership from the weights")
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path)
