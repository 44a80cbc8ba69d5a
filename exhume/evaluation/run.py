"""Evaluate a Reconstruction against a victim's training set and write the run folder's figures."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exhume.errors import ConfigError
from exhume.evaluation.metrics import EvalResult, evaluate_images
from exhume.evaluation.plots import candidates_grid, pairs_grid, plot_sorted_ssim, plot_ssim_vs_margin
from exhume.losses import margin


def training_margins(victim, train) -> np.ndarray | None:
    """Each training image's margin ``y_i Φ(x_i)`` under the victim (evaluator-side); None for regression."""
    if victim.task == "regression":
        return None
    model = victim.model.float().eval()
    with torch.no_grad():
        return margin(model(train.centred.float()), train.y).double().numpy()


def evaluate(recon, victim, pool_size: int = 1000, match: str = "ssim", out: str | Path | None = None,
             pool_seed: int = 1, figures: bool = True) -> EvalResult:
    """Judge ``recon`` (its candidates in display space) against ``victim``'s training set.

    The pool of unseen images comes from the same dataset and classes, disjoint from the training
    indices (``pool_size`` images, seeded). With ``out``, writes ``metrics.json``,
    ``arrays.npz`` and the figures there.

    **Control.** ``n`` further unseen images (disjoint from the training set and the pool) are
    judged exactly like the training images: how many of them does a candidate match better than
    the best pool image? Candidates that are merely plausible digits score about as often on these
    non-members as on the members; candidates that carry training data score on members only.
    ``"memorised_control"`` is that count, the baseline the memorisation count must beat.
    """
    from exhume.data import dataset_of, make_pool

    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
        raise ConfigError(f"pool_size must be a non-negative integer (0: no memorisation count), got {pool_size!r}")
    t0 = time.perf_counter()
    ds = dataset_of(victim.data_spec) if victim.data_spec is not None else None  # read once: training set and pool
    train = victim.load_train_set(ds)
    pool = control = None
    if pool_size > 0:
        spec = train.spec
        unseen = make_pool(ds, spec["task"], pool_size + len(train), exclude=train.indices, seed=pool_seed)
        order = torch.randperm(len(unseen), generator=torch.Generator().manual_seed(pool_seed))
        n_control = max(0, min(len(train), len(unseen) - 1))
        control, pool = unseen.x[order[:n_control]], unseen.x[order[n_control:]]
    candidates = recon.candidates.float().clamp(0, 1)
    result = evaluate_images(candidates, train.x, pool, margins=training_margins(victim, train), match=match)
    members = getattr(recon, "provenance", {}).get("members")
    if members is not None and "memorised" in result.arrays:
        from exhume.evaluation.restarts import restart_breakdown

        extra, arrays = restart_breakdown(candidates, train.x, result.arrays["pool_ssim"], members, result.arrays["memorised"], match)
        result.metrics.update(extra)
        result.arrays.update(arrays)
    if control is not None and len(control) > 0:
        ctrl = evaluate_images(candidates, control, pool, match=match)
        result.metrics["memorised_control"] = ctrl.metrics["memorised"]
        result.metrics["control_size"] = int(len(control))
        result.metrics["one_to_one_ssim>=0.4_control"] = ctrl.metrics["one_to_one_ssim>=0.4"]
        result.metrics["memorised_control_note"] = (
            "the memorisation count computed for unseen images (non-members) in place of the training images; "
            "a leak shows as memorised well above memorised_control")
    result.metrics["pool_description"] = (
        None if pool is None else
        f"{len(pool)} unseen images of the same classes from {train.spec['dataset']}, disjoint from the training set "
        f"and from the {0 if control is None else len(control)} control images (seed {pool_seed})"
    )
    if pool is not None:
        from exhume.evaluation.membership import membership_uncertainty

        mu = membership_uncertainty(candidates, train.x, pool)
        result.metrics["membership_auc"] = mu["auc"]
        result.metrics["membership"] = {k: v for k, v in mu.items() if k not in ("d_train", "d_heldout")}
    result.metrics["attack"] = {"method": recon.method, "seed": recon.seed, "config": recon.config, **recon.summary}
    result.metrics["victim"] = {k: victim.metrics.get(k) for k in ("train_accuracy", "test_accuracy", "final_loss", "stationarity_residual", "epochs")}
    result.metrics["victim"].update(arch=victim.arch, task=victim.task, loss=victim.loss, weight_decay=victim.weight_decay, data=train.spec)
    result.metrics["evaluation_seconds"] = round(time.perf_counter() - t0, 3)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        result.save(out)
        if figures:
            pool_x = pool
            plot_sorted_ssim(result, out / "ssim_sorted.png")
            if "margin" in result.arrays:
                plot_ssim_vs_margin(result, out / "ssim_vs_margin.png")
            pairs_grid(candidates, train.x, pool_x, result, out / "best_pairs.png", which="best")
            pairs_grid(candidates, train.x, pool_x, result, out / "worst_pairs.png", which="worst")
            candidates_grid(candidates, out / "candidates.png")
    return result


def summary_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The few numbers a person needs, as (label, value) rows."""
    n = metrics["n_train"]
    rows = [
        ("training images", str(n)),
        ("candidates", str(metrics["n_candidates"])),
        ("SSIM >= 0.4 (nearest candidate)", f"{metrics['ssim>=0.4']} / {n}"),
        ("SSIM >= 0.4 (one-to-one, Hungarian)", f"{metrics['one_to_one_ssim>=0.4']} / {n}"),
        ("SSIM >= 0.5 (one-to-one)", f"{metrics['one_to_one_ssim>=0.5']} / {n}"),
        ("mean SSIM (nearest)", f"{metrics['ssim_mean']:.3f}"),
    ]
    if metrics.get("memorised") is not None:
        rows += [
            (f"best of {metrics['pool_size']} unseen images reaches SSIM >= 0.4", f"{metrics['pool_ssim>=0.4']} / {n}"),
            ("MEMORISED (beats the best unseen image)", f"{metrics['memorised']} / {n}"),
        ]
        if metrics.get("memorised_control") is not None:
            rows.append((f"  same count for {metrics['control_size']} unseen images (control)",
                         f"{metrics['memorised_control']} / {metrics['control_size']}"))
        if metrics.get("memorised_found_by") is not None:
            hist = metrics["memorised_found_by"]
            rows.append(("  memorised images found by k restarts", ", ".join(f"k={k}: {v}" for k, v in hist.items()) or "none"))
            rows.append(("  memorised per restart", " ".join(str(c) for c in metrics["memorised_per_restart"])))
    cfg = (metrics.get("attack") or {}).get("config") or {}
    if cfg.get("oracle_init"):
        rows.append(("initialisation", f"{cfg.get('init')} (ORACLE: built from the victim's data)"))
    if metrics.get("membership_auc") is not None:
        rows.append(("membership AUC (0.5: candidates cannot tell members)", f"{metrics['membership_auc']:.3f}"))
    rows.append(("SSIM window", metrics["ssim_window"]))
    return rows


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


