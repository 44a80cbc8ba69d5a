"""Where the training inputs' span shows in a model's weights: the one span rule (:func:`span_of`), weights only.

At a stationary point of ``mean ℓ + (w/2)‖θ‖²`` every weight matrix that acts linearly on its input is
``W = Σ_i δ_i a_iᵀ``: its rows lie in the span of the ``n`` inputs ``a_i`` it saw (the images for an MLP's first
layer, the pooled features for the layer after a CNN's convolutions). Such a layer's spectrum collapses to rank ≈ n.
A first layer shows it at any point of training, above its initialisation's noise (its gradients always lie in the
fixed inputs' span); a layer above the first only near a stationary point, where its inputs have stopped moving and
weight decay has forgotten those of earlier epochs. A layer that sees ``n`` or fewer directions (a 3×3
convolution's 9 per patch, a 1-unit output) cannot show it: the data may fill them.

:func:`span_of` is the rule every reader of the span uses: kkt's projection on an MLP's first layer
(:mod:`exhume.attacks.kkt.subspace`), the feature stage's layer on a CNN (:mod:`exhume.attacks.kkt.stage`), and the
report of :func:`layer_spectra` that ``exhume train`` and ``exhume audit`` print (per weight tensor, a convolution as
``out × in·k·k``: its directions, how many hold ``SPAN_ENERGY`` of its energy, ``σ_n/σ_1``, ``σ_{n+1}/σ_1`` and
whether it shows the span; ``span_layer``, the first that does; with the start known, the same rule read on what
training added, :func:`delta_of`, ``delta_span_layer``). :func:`span_gap` is the stopping measure of
``exhume train --span-threshold``. :func:`noise_edge` reads the i.i.d. initialisation's scale from a spectrum, and
:func:`learned_part` keeps what training added above it (kkt's ``denoise``, docs/defaults.md#kkt-denoise). The
evaluator's side (the training inputs' distance to each row space) is :mod:`exhume.evaluation.layers`.
Measurements: docs/METHODS.md §5.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from exhume.equations.formulation import theta_squared

#: the share of a layer's energy whose directions are counted (``rank_999``), against n
SPAN_ENERGY = 0.999
#: a matrix shows the span when σ_{n+1}/σ_1 is at most this (docs/defaults.md#kkt-subspace-one-layer-up: on the 28×28
#: CNN the stage gained at 2.6e-3 and below, tied at 1.4e-2, and lost on an 8×8 CNN at 2.2e-2)
SPAN_GAP = 1e-2
#: no span where the initialisation's i.i.d. noise holds more than this share of the matrix's energy
MAX_NOISE_SHARE = 0.1
#: the directions counted are those above the initialisation's noise edge × this
EDGE_MARGIN = 1.1
#: ... and above this many machine epsilons (of the precision the weights were trained in) of the largest singular value
FLOOR_EPS = 10.0
#: larger weight tensors are not decomposed by the diagnostics (their SVD would cost more than a report should)
MAX_ELEMENTS = 1 << 24


@dataclass
class Span:
    """What one weight matrix shows of its inputs' span (:func:`span_of`): ``rank`` directions kept (0: none), their
    ``basis`` ``(d, rank)`` when asked for, the ``singular`` values, and ``facts`` as far as the rule got."""

    shows: bool
    why: str
    singular: torch.Tensor
    rank: int = 0
    basis: torch.Tensor | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def span_of(w: torch.Tensor, n: int, precision: torch.dtype | None = None, *, inputs_fixed: bool = False,
            basis: bool = False) -> Span:
    """The span rule: whether ``w`` (``out × rest``) shows the span of the ``n`` inputs it was trained on, and its directions.

    It does when it sees more than ``n`` directions, the initialisation's i.i.d. noise (:func:`noise_edge`) holds at most
    ``MAX_NOISE_SHARE`` of its energy, and ``σ_{n+1}/σ_1 ≤ SPAN_GAP`` or, where its inputs are fixed (the layer the data
    enter through, every gradient row of which lies in their span), ``σ_{n+1}`` lies within that noise (at most the cut:
    the larger of ``EDGE_MARGIN`` × the noise's edge and ``FLOOR_EPS`` epsilons of ``precision`` times ``σ_1``). A layer
    whose inputs moved in training shows it only once its spectrum collapsed. The directions kept: those above the cut,
    at most ``n``; ``basis=True`` also returns them."""
    mat = w.detach().reshape(w.shape[0], -1)
    _, s, vh = torch.linalg.svd(mat.double().cpu(), full_matrices=False) if basis else (None, torch.linalg.svdvals(mat.double().cpu()), None)
    p = s.numel()
    if p <= n:
        return Span(False, f"it sees {p} direction{'' if p == 1 else 's'}, no more than n = {n}: the training data may fill "
                    f"{'it' if p == 1 else f'all {p} directions'}", s)
    noise = noise_share(s, tuple(mat.shape), n)
    if noise is None:
        return Span(False, "all its singular values are zero", s)
    edge, share = noise
    gap, floor = float(s[n] / s[0]), FLOOR_EPS * torch.finfo(precision or w.dtype).eps * float(s[0])
    cut = max(EDGE_MARGIN * edge, floor)
    k = int((s > cut).sum())
    facts = {"sigma_after_n": gap, "noise_share": share, "cut": cut, "cut_by": "initialisation" if EDGE_MARGIN * edge >= floor
             else "precision", "rank_above_noise": k}
    if share > MAX_NOISE_SHARE:
        return Span(False, f"the initialisation still holds {share:.0%} of its energy, so the training data's directions are "
                    "buried in it", s, facts=facts)
    if gap > SPAN_GAP and not (inputs_fixed and k <= n):
        return Span(False, f"σ_{n + 1}/σ_1 = {gap:.2g} is above {SPAN_GAP:g}: its spectrum has not collapsed to rank ≤ n, "
                    "the training inputs' span" + (f", and {k} directions stand above its noise ({cut:.3g})" if inputs_fixed else ""),
                    s, facts=facts)
    if k == 0:
        return Span(False, f"none of its singular values lies above its noise ({cut:.3g})", s, facts=facts)
    rank = min(k, n)
    why = (f"σ_{n + 1}/σ_1 = {gap:.2g}" + (f" lies within its initialisation's noise ({cut / float(s[0]):.2g} of σ_1)" if gap > SPAN_GAP
                                          else ": its spectrum collapses to rank ≤ n") + f"; {rank} directions stand above its noise")
    return Span(True, why, s, rank, None if vh is None else vh[:rank].T.contiguous().to(w.device, w.dtype), facts)


def delta_of(w: torch.Tensor, w0: torch.Tensor, c: float | None = None) -> tuple[torch.Tensor, float]:
    """What training added to a weight tensor whose start ``w0`` is known: ``(w − c·w0, c)``, ``c`` the start's share
    left by weight decay (None: the nuclear norm's minimum, :func:`exhume.equations.trajectory.nuclear_decay`, as kkt
    fits it). Its row space is the span of the inputs the layer saw along training, at any point of training
    (docs/METHODS.md §5); :func:`span_of` decides whether it shows."""
    w = w.detach()
    if c is None:
        from exhume.equations.trajectory import nuclear_decay

        c = nuclear_decay(w.reshape(w.shape[0], -1), w0.reshape(w.shape[0], -1))
    return w - float(c) * w0.to(w), float(c)


def spectrum_row(name: str, w: torch.Tensor, n: int, inputs_fixed: bool = False) -> dict[str, Any]:
    """One weight tensor's row: its shape as ``out × in``, its spectrum against ``n`` and whether it shows the span
    (:func:`span_of`; ``inputs_fixed``: it is the first weight layer, which the inputs enter through)."""
    mat = w.detach().reshape(w.shape[0], -1)
    row: dict[str, Any] = {"name": name, "shape": [int(d) for d in mat.shape], "directions": int(min(mat.shape))}
    if mat.numel() > MAX_ELEMENTS:
        return {**row, "shows_span": False, "why": f"not decomposed: over {MAX_ELEMENTS:,} entries"}
    span = span_of(w, n, inputs_fixed=inputs_fixed)
    s, p = span.singular, row["directions"]
    row["rank_999"] = int(((s**2).cumsum(0) / (s**2).sum().clamp_min(1e-300) < SPAN_ENERGY).sum()) + 1
    if float(s[0]) > 0 and n <= p:
        row.update(sigma_n=float(s[n - 1] / s[0]), sigma_after_n=float(s[n] / s[0]) if n < p else None)
    return {**row, "shows_span": span.shows, "why": span.why, **({"rank": span.rank} if span.shows else {})}


def span_gap(model: nn.Module, n: int) -> float | None:
    """The largest σ_{n+1}/σ_1 over the weight layers that see more than ``n`` directions (None: no such layer): below
    :data:`SPAN_GAP` every one of them shows the training inputs' span (a stopping rule for training, weights only)."""
    rows = (spectrum_row(k, w, n) for k, w in model.named_parameters() if w.dim() >= 2)
    return max((r["sigma_after_n"] for r in rows if r.get("sigma_after_n") is not None), default=None)


def delta_row(w: torch.Tensor, w_start: torch.Tensor, n: int, decay: float | None, inputs_fixed: bool) -> dict[str, Any]:
    """:func:`spectrum_row` of what training added to ``w`` (:func:`delta_of`), with its ``decay`` ``c`` and where it came from."""
    if torch.equal(w.detach(), w_start.to(w.device, w.dtype)):
        return {"shows_span": False, "why": "it equals its start: training left it as it was", "decay": None}
    if w.numel() > MAX_ELEMENTS:
        return {"shows_span": False, "why": f"not decomposed: over {MAX_ELEMENTS:,} entries", "decay": None}
    delta, c = delta_of(w, w_start, decay)
    row = spectrum_row("", delta, n, inputs_fixed=inputs_fixed)
    rule = "from the training settings" if decay is not None else "fitted: the lowest nuclear norm"
    why = row["why"].replace("the initialisation still holds", "a part spread evenly over its directions (as i.i.d. noise is) holds")
    return {k: v for k, v in row.items() if k not in ("name", "shape", "directions")} | {"why": why, "decay": c, "decay_rule": rule}


def layer_spectra(model: nn.Module, n: int, start: dict[str, torch.Tensor] | None = None,
                  decay: float | None = None) -> dict[str, Any]:
    """Each weight tensor's spectrum against ``n`` training points and the first layer that shows their span (weights
    only; see the module docstring): ``{"n", "energy", "layers": [rows], "span_layer", "finding"}``. With ``start`` (the
    weights training began from, all or some), each row with a start also holds ``delta``, the same of what training
    added (:func:`delta_row`; ``decay``: ``c`` from the training settings, None: fitted per layer), and the report
    ``delta_span_layer``, the first layer where that shows the span."""
    if int(n) < 1:
        raise ValueError(f"n must be a positive number of training points, got {n}")
    weights = [(name, p) for name, p in model.named_parameters() if p.dim() >= 2]
    rows = [spectrum_row(name, p, int(n), inputs_fixed=i == 0) for i, (name, p) in enumerate(weights)]
    span = next((r["name"] for r in rows if r["shows_span"]), None)
    report = {"n": int(n), "energy": SPAN_ENERGY, "layers": rows, "span_layer": span}
    if start is None:
        return {**report, "finding": "Weights only: " + span_finding(rows, span, int(n))}
    for i, ((name, p), row) in enumerate(zip(weights, rows)):
        if name in start:
            row["delta"] = delta_row(p, start[name], int(n), decay, inputs_fixed=i == 0)
    delta_span = next((r["name"] for r in rows if r.get("delta", {}).get("shows_span")), None)
    return {**report, "delta_span_layer": delta_span, "finding": start_finding(rows, span, delta_span, int(n))}


def _position(rows: list[dict[str, Any]], name: str) -> str:
    return "the first weight layer" if rows and rows[0]["name"] == name else "a layer above the first"


def span_finding(rows: list[dict[str, Any]], span: str | None, n: int) -> str:
    """One sentence: at which layer the weights show the training inputs' span, or that none does and why."""
    if span is not None:
        row = next(r for r in rows if r["name"] == span)
        return (f"the weights show the training inputs' span at {span} ({_position(rows, span)}): {row['why']}; "
                f"{row['rank_999']} directions hold {SPAN_ENERGY:.1%} of its energy, n = {n}.")
    wide = [r for r in rows if r["directions"] > n and r.get("sigma_after_n") is not None]
    if not wide:
        return f"no weight layer sees more than n = {n} directions, so none can show the training inputs' span."
    near = min(wide, key=lambda r: r["sigma_after_n"])
    return (f"no weight layer shows the training inputs' span: at the closest, {near['name']}, {near['why']}; "
            f"{near['rank_999']} directions hold {SPAN_ENERGY:.1%} of its energy, n = {n} (a layer above the first shows it "
            "only near a stationary point).")


def start_finding(rows: list[dict[str, Any]], span: str | None, delta_span: str | None, n: int) -> str:
    """The sentences of :func:`layer_spectra` with the start known: where what training added shows the training inputs'
    span (or that it does nowhere, at the closest layer), then what the weights alone show (:func:`span_finding`)."""
    weights_only = " Weights only: " + span_finding(rows, span, n)
    if delta_span is not None and span is not None:
        gap = next(r for r in rows if r["name"] == span).get("sigma_after_n")
        weights_only = f" Weights only: the weights show it too, at {span}" + ("." if gap is None else f" (σ_{n + 1}/σ_1 = {gap:.2g}).")
    if delta_span is not None:
        d = next(r for r in rows if r["name"] == delta_span)["delta"]
        return (f"With the start known, what training added to {delta_span} ({_position(rows, delta_span)}; W − c·W_start, "
                f"c = {d['decay']:.3g} {d['decay_rule']}) shows the training inputs' span: {d['why']}; {d['rank_999']} "
                f"directions hold {SPAN_ENERGY:.1%} of its energy, n = {n}." + weights_only)
    wide = [r for r in rows if r["directions"] > n and r.get("delta", {}).get("sigma_after_n") is not None]
    neither = ("neither what training added nor the weights show the training inputs' span at any layer" if span is None
               else "what training added shows the training inputs' span at no layer")
    if not wide:
        return f"With the start known, {neither}." + weights_only
    near = min(wide, key=lambda r: r["delta"]["sigma_after_n"])
    d = near["delta"]
    return (f"With the start known, {neither}: at the closest, what training added "
            f"to {near['name']} (c = {d['decay']:.3g} {d['decay_rule']}): {d['why']}; {d['rank_999']} directions hold "
            f"{SPAN_ENERGY:.1%} of its energy, n = {n}." + weights_only)


def noise_edge(singular: torch.Tensor, shape: tuple[int, int], n_guess: int) -> tuple[float, float] | None:
    """``(σ, edge)``: the entry scale of the i.i.d. part of a ``shape`` matrix whose spectrum is ``singular``, and its largest singular value.

    The scale comes from the singular values below index ``max(n_guess, p/2)`` (``p`` of them in
    all), matched by median ratio against a seeded standard Gaussian matrix of the same shape.
    None where the data could fill the spectrum (``n_guess ≥ p``).
    """
    p = singular.numel()
    if n_guess >= p:
        return None
    lo = max(n_guess, p // 2)
    ref = _gaussian_spectrum(tuple(int(d) for d in shape))
    sigma = float(torch.median(singular[lo:].double().cpu() / ref[lo:]))
    return sigma, sigma * float(ref[0])


@functools.lru_cache(maxsize=16)
def _gaussian_spectrum(shape: tuple[int, int]) -> torch.Tensor:
    """The singular values of a seeded standard Gaussian ``shape`` matrix (the same for every restart: computed once)."""
    gen = torch.Generator().manual_seed(0)
    return torch.linalg.svdvals(torch.randn(*shape, generator=gen, dtype=torch.float64))


def noise_share(singular: torch.Tensor, shape: tuple[int, int], n_guess: int) -> tuple[float, float] | None:
    """``(edge, share)``: :func:`noise_edge`'s edge and the share of the matrix's energy its i.i.d. noise holds (None as there)."""
    noise = noise_edge(singular, shape, n_guess)
    energy = float((singular.double() ** 2).sum())
    if noise is None or energy <= 0:
        return None
    sigma, edge = noise
    return edge, sigma ** 2 * math.prod(shape) / energy


#: a weight tensor is replaced by its part above the initialisation's edge when that noise holds at least this share of it
MIN_DENOISE_SHARE = 0.05
#: below this share of ‖θ‖² above the noise nothing is replaced (there would be no equation left)
MIN_LEARNED_SHARE = 1e-6


def learned_part(params: dict[str, torch.Tensor], n_guess: int) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """What training added to each weight matrix, where the initialisation's noise still shows: ``(target, info)``.

    Without weight decay gradient descent keeps the random initialisation, ``W = W₀ + Σ_i (…)``, and only the sum is
    what the stationarity equation explains (docs/METHODS.md §5). Each parameter with two or more dimensions (convolutions flattened to ``out × rest``) whose
    smaller side ``p`` exceeds ``n_guess`` has its i.i.d. noise scale estimated as in
    :func:`noise_edge`; where that noise holds at least ``MIN_DENOISE_SHARE`` of the tensor's
    energy the tensor is replaced by its singular components above ``EDGE_MARGIN`` × the noise's
    edge (possibly none). Others stay as they are. ``target`` is None when nothing changed.
    Weights only: attacker-side.
    """
    target: dict[str, torch.Tensor] = {}
    layers: dict[str, dict[str, Any]] = {}
    for name, w in params.items():
        if w.dim() < 2:
            continue
        mat = w.detach().reshape(w.shape[0], -1).double()
        if min(mat.shape) <= n_guess:
            continue
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
        noise = noise_share(s.cpu(), tuple(mat.shape), n_guess)
        if noise is None or noise[1] < MIN_DENOISE_SHARE:
            continue
        edge, share = noise
        k = int((s > EDGE_MARGIN * edge).sum())
        target[name] = ((u[:, :k] * s[:k]) @ vh[:k]).reshape(w.shape).to(w.dtype)
        layers[name] = {"noise_share": round(share, 4), "rank_kept": k,
                        "energy_kept": round(float((s[:k] ** 2).sum() / (s ** 2).sum()), 4)}
    if not target:
        return None, {"denoise_used": "none", "denoise_reason": "no weight tensor's initialisation noise holds "
                      f"{MIN_DENOISE_SHARE:.0%} or more of it"}
    full = {k: target.get(k, v.detach()) for k, v in params.items()}
    kept = theta_squared(full) / theta_squared(params)
    if not kept > MIN_LEARNED_SHARE:  # e.g. an untrained network: nothing stands above its noise, no equation is left to solve
        return None, {"denoise_used": "none", "denoise_layers": layers, "denoise_reason": f"only {kept:.2g} of ‖θ‖² stands above "
                      "the initialisation's noise: the weights show nothing learned, so they are used as they are"}
    return full, {"denoise_used": "above-noise", "denoise_layers": layers, "denoise_theta_share": round(kept, 4)}
