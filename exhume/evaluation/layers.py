"""The training inputs at each weight layer (EVALUATOR-SIDE: it reads the training inputs).

Beside the weights-only spectra of :mod:`exhume.equations.span`, for every ``nn.Linear`` and ``nn.Conv2d``
module of the model, at the training inputs:

- **near-zero pre-activations**: the share of the layer's outputs within ``1e-2`` and ``1e-3`` of zero, and their
  median magnitude. A stationarity attack replaces ReLU's step derivative by a smooth one, which is wrong exactly
  there; a layer's own scale shows how wrong.
- **the inputs' distance to the layer's top-n row space**: the median (and largest) relative distance of what the
  layer saw (the images, a convolution's patches, the features after the convolutions) to the span of its ``n``
  leading right singular vectors. At a stationary point it is ≈ 0 at every layer that can show the span; far from
  one, a layer above the first holds the features of earlier epochs and the distance stays large. None where the
  layer sees ``n`` or fewer directions. With the start known, also to the top-n row space of what training added
  (:func:`exhume.equations.span.delta_of`), which holds the training inputs without a stationary point.

Measured in batches of the inputs; a convolution's patches are subsampled (seeded) to ``MAX_ROWS``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from exhume.equations.span import delta_of, layer_spectra
from exhume.models.tap import Tap

#: the pre-activation magnitudes counted as near zero
NEAR_ZERO = (1e-2, 1e-3)
#: at most this many input rows (images, patches, features) per layer enter the distance
MAX_ROWS = 20_000
BATCH = 64


def _rows_in(module: nn.Module, inp: torch.Tensor) -> torch.Tensor | None:
    """What ``module`` multiplies by its weight, one row per input it sees (patches for a convolution), or None."""
    if isinstance(module, nn.Linear):
        return inp.reshape(-1, inp.shape[-1])
    if isinstance(module, nn.Conv2d) and module.groups == 1 and not isinstance(module.padding, str):
        cols = F.unfold(inp, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride)
        return cols.transpose(1, 2).reshape(-1, cols.shape[1])
    return None


def _collect(model: nn.Module, x: torch.Tensor, names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Run ``x`` through ``model`` in batches with a tap on the modules of ``names`` (module → weight name)."""
    modules = dict(model.named_modules())
    seen: dict[str, dict[str, Any]] = {w: {"counts": [0] * len(NEAR_ZERO), "total": 0, "mags": [], "rows": []} for w in names.values()}
    gen = torch.Generator().manual_seed(0)

    def take(mod_name: str, module: nn.Module, args, out) -> None:
        rec = seen[names[mod_name]]
        z = out.detach().abs().reshape(-1).double()
        rec["total"] += z.numel()
        for i, t in enumerate(NEAR_ZERO):
            rec["counts"][i] += int((z <= t).sum())
        rec["mags"].append(z[torch.randperm(z.numel(), generator=gen)[:MAX_ROWS]])
        rows = _rows_in(module, args[0].detach())
        if rows is not None:
            rec["rows"].append(rows[torch.randperm(rows.shape[0], generator=gen)[:MAX_ROWS]].double())

    with Tap(model, [m for m in names if m in modules], take=take), torch.no_grad():
        for i in range(0, x.shape[0], BATCH):
            model(x[i:i + BATCH])
    return seen


def _distance(w: torch.Tensor, rows: torch.Tensor, n: int) -> dict[str, float] | None:
    """Median and largest relative distance of ``rows`` to the span of ``w``'s top-``n`` right singular vectors."""
    mat = w.detach().reshape(w.shape[0], -1).double().cpu()
    if min(mat.shape) <= n or rows.shape[1] != mat.shape[1]:
        return None
    v = torch.linalg.svd(mat, full_matrices=False)[2][:n].T
    rows = rows[rows.norm(dim=1) > 0]
    if rows.shape[0] == 0:
        return None
    d = (rows - (rows @ v) @ v.T).norm(dim=1) / rows.norm(dim=1)
    return {"input_distance_median": float(d.median()), "input_distance_max": float(d.max())}


def layer_diagnostics(model: nn.Module, x: torch.Tensor, n: int | None = None, start: dict[str, torch.Tensor] | None = None,
                      decay: float | None = None) -> dict[str, Any]:
    """:func:`~exhume.equations.span.layer_spectra` of ``model`` with, per layer, the near-zero pre-activations at
    the (centred, as the model takes them) training inputs ``x`` and their distance to its top-``n`` row space
    (``n``: default ``len(x)``); with ``start`` (and ``decay``, as there) also to that of what training added;
    ``finding`` says where the span shows and how far the inputs are from it."""
    n = int(n or x.shape[0])
    report = layer_spectra(model, n, start, decay)
    params = dict(model.named_parameters())
    names = {r["name"].rsplit(".", 1)[0]: r["name"] for r in report["layers"] if r["name"].endswith(".weight")}
    seen = _collect(model, x, names)
    for row in report["layers"]:
        rec = seen.get(row["name"])
        if rec is None or not rec["total"]:
            row["inputs"] = "not measured: not an nn.Linear or nn.Conv2d module's weight"
            continue
        for t, c in zip(NEAR_ZERO, rec["counts"]):
            row[f"preactivations_within_{t:g}"] = c / rec["total"]
        row["preactivation_median_abs"] = float(torch.cat(rec["mags"]).median())
        if rec["rows"]:
            rows = torch.cat(rec["rows"])
            row.update(_distance(params[row["name"]], rows, n) or {})
            if row.get("delta", {}).get("decay") is not None:
                delta, _ = delta_of(params[row["name"]], start[row["name"]], row["delta"]["decay"])
                row["delta"].update(_distance(delta, rows, n) or {})
    report["finding"] = _finding(report)
    return report


def _finding(report: dict[str, Any]) -> str:
    """The weights' finding, with the inputs' distance at the span's layer (or at the closest wide layer): what training
    added's row space first where it shows the span."""
    rows = [r for r in report["layers"] if "input_distance_median" in r]
    if not rows:
        return report["finding"]
    at = next((r for r in rows if r["name"] in (report.get("delta_span_layer"), report["span_layer"])), None)
    at = at or min(rows, key=lambda r: r["input_distance_median"])
    added = at.get("delta", {}).get("input_distance_median")
    also = "" if added is None else f", {added:.2%} outside that of what training added"
    return (f"{report['finding']} EVALUATOR: the training inputs to {at['name']} lie {at['input_distance_median']:.2%} "
            f"(median) outside its top-{report['n']} row space{also}.")


def layers_text(report: dict[str, Any]) -> str:
    """:func:`layer_diagnostics`'s report as a few lines for a terminal: one per weight layer (with the start known, the
    spectrum of what training added, Δ, beside that of the weights), then the finding."""
    n, known = report["n"], any("delta" in r for r in report["layers"])
    sig_head = f"σ{n + 1}/σ1"
    lines = [f"{'weight layer':<28} {'out x in':>12} {'99.9% in':>9} {sig_head:>9}" + (f" {'Δ 99.9% in':>10} {'Δ ' + sig_head:>11}"
             if known else "") + f" {'|z|<1e-2':>9} {'inputs outside top-n':>21}"]
    for r in report["layers"]:
        shape = "x".join(str(d) for d in r["shape"])
        within = r.get("preactivations_within_0.01")
        dist = r.get("input_distance_median")
        delta = r.get("delta", {})
        cells = f"{r['name'][:28]:<28} {shape:>12} {r.get('rank_999', '-'):>9} {_g(r.get('sigma_after_n')):>9}"
        if known:
            cells += f" {delta.get('rank_999', '-'):>10} {_g(delta.get('sigma_after_n')):>11}"
        lines.append(cells + f" {'-' if within is None else f'{within:.1%}':>9} {'-' if dist is None else f'{dist:.2%} (median)':>21}")
    return "\n".join(lines + [report["finding"]])


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"
