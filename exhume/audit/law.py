"""Where a model sits against the law of data reconstruction: its trained parameters ``p`` against ``d·n``.

Iurada, Bombari, Tommasi and Mondelli ("A Law of Data Reconstruction for Random Features (and
Beyond)", 2026) show that once the trained parameters outnumber the data's dimension times the
number of training samples, ``p ≫ d·n``, what training added to the weights (the start known)
determines every training sample: proven for random features, measured on two-layer networks and
ResNets. :func:`law_record` is the count an audit reports beside its verdict (``metrics.json``'s
``law``; docs/audit.md says what it means and what it does not), and :func:`measured_reading` the
measured curve's reading beside it: what exhume recovered from models of the same family near the
same ``p/(d·n)`` (``law_measured.json``, shipped with the package, written by ``exhume experiment
law`` at its CPU default). Outside the measured ratios, for a family or an attack not measured, or
without the start, it says so instead of extrapolating.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from exhume.audit.curve import load_curve, read_at
from exhume.starts import frozen_names

#: the measured curve the audit reads (``law-curve.json`` of ``exhume experiment law`` at its CPU default)
MEASURED = Path(__file__).with_name("law_measured.json")
#: a ratio within this factor of a measured one reads that point alone
SAME_RATIO = 1.1
#: p/(d·n) at and above which the model is in the law's regime (the count alone; the theorem asks p ≫ d·n)
LAW_THRESHOLD = 1.0


def trained_parameters(model: nn.Module, start: dict | None) -> tuple[int, str]:
    """``(p, how it was counted)``: with a start, the parameters training changed (those bit-equal to their start are
    frozen); without one, every parameter (nothing tells a frozen one apart)."""
    params = dict(model.named_parameters())
    if start is None:
        return sum(v.numel() for v in params.values()), "every parameter (no start to tell a frozen one apart)"
    frozen = set(frozen_names(model, start))
    p = sum(v.numel() for k, v in params.items() if k not in frozen)
    return p, f"the parameters that differ from the start ({len(frozen)} tensors equal to it left out)"


def law_record(model: nn.Module, start: dict | None, input_shape, n: int) -> dict[str, Any]:
    """``{"p", "d", "n", "p_over_dn", "regime", "p_counted", "definition"}`` for a model trained on ``n`` inputs of ``input_shape``."""
    p, counted = trained_parameters(model, start)
    d = math.prod(int(s) for s in input_shape)
    ratio = p / (d * max(int(n), 1))
    regime = ("above the law's threshold (p ≥ d·n): what training added can determine every training sample"
              if ratio >= LAW_THRESHOLD else "below the law's threshold (p < d·n): what training added cannot determine "
              "every training sample, other inputs explain it as well")
    return {"p": p, "d": d, "n": int(n), "p_over_dn": round(ratio, 4), "regime": regime, "p_counted": counted,
            "definition": "p trained parameters, d = input dimension, n = training samples; the law of data reconstruction "
                          "(random features proven, deeper networks measured) needs p ≫ d·n and the start known"}


def load_measured(path: Path = MEASURED) -> dict[str, Any]:
    """The measured curve (checked: its points, method, variants and provenance)."""
    return load_curve(path, "the law's measured curve (law-curve.json of exhume experiment law)",
                      ("points", "method", "variants", "measured_on", "date", "command"))


def formulation(variants: dict[str, dict], attack_args: dict[str, Any]) -> str | None:
    """The measured formulation the audit's attack runs: the one whose multipliers setting the attack's arguments name,
    else the one measured with no arguments (the attack's defaults); None if none was."""
    asked = attack_args.get("multipliers")
    for name, args in variants.items():
        if asked is not None and args.get("multipliers") == asked:
            return name
    return next((name for name, args in variants.items() if not args), None)


def measured_reading(record: dict[str, Any], family: str | None, start_known: bool, method: str,
                     attack_args: dict[str, Any], table: dict[str, Any] | None = None, task: str = "binary") -> dict[str, Any]:
    """``{"status", "reading", …}``: what the measured curve says of a model at ``record``'s ``p/(d·n)`` (status
    ``"read"``, with ``percent`` low and high and ``at_ratios``), or why it says nothing (``"no start"``,
    ``"method not measured"``, ``"task not measured"``, ``"family not measured"``, ``"outside the measured range"``,
    ``"no measured curve"``)."""
    from exhume.errors import DataError

    try:
        table = load_measured() if table is None else table
    except DataError as e:
        return {"status": "no measured curve", "reading": f"no measured reading: {e}"}
    source = {k: table[k] for k in ("measured_on", "date", "command")}
    variant = formulation(table["variants"], attack_args) if method == table["method"] else None
    points = sorted((p for p in table["points"] if p["family"] == family and p["variant"] == variant), key=lambda p: p["p_over_dn"])
    families = sorted({p["family"] for p in table["points"]})
    ratio = record["p_over_dn"]
    if not start_known:
        return _said("no start", "the curve was measured with the start known; without it the law says nothing", source)
    if variant is None:
        return _said("method not measured", f"the curve was measured with {table['method']} ({', '.join(table['variants'])}"
                     f" multipliers), not with {method} as run here", source)
    if task != table.get("task", "binary"):
        return _said("task not measured", f"the curve was measured on {table.get('task', 'binary')} classifiers, not on a "
                     f"{task} one", source)
    if not points:
        return _said("family not measured", f"the curve was measured on {', '.join(families)} models, not on this "
                     f"architecture ({family or 'another family'})", source)
    lo, hi = points[0]["p_over_dn"], points[-1]["p_over_dn"]
    if not lo / SAME_RATIO <= ratio <= hi * SAME_RATIO:
        return _said("outside the measured range", f"p/(d·n) = {ratio:.3g} lies outside the measured {lo:g}–{hi:g} for "
                     f"{family} models: no reading, no extrapolation", source)
    return _read(points, ratio, family, variant, table, source)


def _read(points: list[dict], ratio: float, family: str, variant: str, table: dict, source: dict) -> dict[str, Any]:
    percent, at, amount = read_at(points, "p_over_dn", ratio, SAME_RATIO)
    where = f"at p/(d·n) = {at[0]:g}" if at[0] == at[1] else f"between p/(d·n) = {at[0]:g} and {at[1]:g}"
    text = (f"in this regime exhume recovered {amount} of training sets like yours: {amount} of the training samples of "
            f"{family} models memorised {where}, {table['method']} with {variant} multipliers and the start known "
            f"(measured on {source['measured_on']}, {source['date']}, `{source['command']}`)")
    return {"status": "read", "reading": text, "percent": percent, "at_ratios": at, "family": family, "formulation": variant,
            **source}


def _said(status: str, why: str, source: dict) -> dict[str, Any]:
    return {"status": status, "reading": f"no measured reading: {why}", **source}
