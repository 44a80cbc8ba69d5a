"""An evaluation's metrics as the few rows a person reads in a terminal (``exhume evaluate``, the demo)."""

from __future__ import annotations

from typing import Any


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
        if metrics.get("memorised_control_oracle") is not None:
            rows.append(("  control if the candidates were the training images (ORACLE)",
                         f"{metrics['memorised_control_oracle']} / {metrics['control_size']}"))
        if metrics.get("memorised_found_by") is not None:
            hist = metrics["memorised_found_by"]
            rows.append(("  memorised images found by k restarts", ", ".join(f"k={k}: {v}" for k, v in hist.items()) or "none"))
            rows.append(("  memorised per restart", " ".join(str(c) for c in metrics["memorised_per_restart"])))
        if metrics.get("support_estimate") is not None:
            rows.append(("training points the weights carry (support estimate)", f"~{metrics['support_estimate']:.0f} / {n}"))
    cfg = (metrics.get("attack") or {}).get("config") or {}
    if cfg.get("oracle_init"):
        rows.append(("initialisation", f"{cfg.get('init')} (ORACLE: built from the victim's data)"))
    if metrics.get("membership_auc") is not None:
        rows.append(("membership AUC (0.5: candidates cannot tell members)", f"{metrics['membership_auc']:.3f}"))
    rows += owner_rows(metrics)
    rows.append(("SSIM window", metrics["ssim_window"]))
    if metrics.get("verdict") is not None:
        p = metrics.get("p_value")
        rows.append(("VERDICT", f"{str(metrics['verdict']).upper()}" + ("" if p is None else f" (p = {p:.2g})")))
    return rows


def owner_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The audit's identifiability and membership-from-the-weights rows (none when not measured)."""
    from exhume.evaluation.identifiability import identifiability_line

    rows = []
    line = identifiability_line(metrics.get("identifiability"))
    if line:
        rows.append(("identifiability (EVALUATOR: residual at the training images)", line))
    exposure = metrics.get("membership_exposure")
    for name, s in ((exposure or {}).get("scores") or {}).items():
        t1, t01, auc = s["tpr_at_0.01_fpr"], s["tpr_at_0.001_fpr"], s["auc"]
        rows.append((f"membership {name}: TPR at 1 % / 0.1 % FPR, AUC",
                     f"{100 * t1['value']:.1f} % [{100 * t1['ci95'][0]:.1f}, {100 * t1['ci95'][1]:.1f}] / "
                     f"{100 * t01['value']:.1f} % / {auc['value']:.3f} [{auc['ci95'][0]:.3f}, {auc['ci95'][1]:.3f}]"))
    return rows


def format_table(rows: list[tuple[str, str]]) -> str:
    """The rows as two aligned columns."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
