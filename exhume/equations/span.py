"""Where the training inputs' span shows in a model's weights: each weight layer's spectrum against ``n`` (weights only).

At a stationary point of ``mean ℓ + (w/2)‖θ‖²`` every weight matrix that acts linearly on its input is
``W = Σ_i δ_i a_iᵀ``: its rows lie in the span of the ``n`` inputs ``a_i`` it saw (the images for an MLP's first
layer, the pooled features for the layer after a CNN's convolutions). Such a layer's spectrum collapses to rank ≈ n:
almost all its energy in at most ``n`` directions. A first layer with a small initialisation shows it at any point
of training (its gradients always lie in the fixed inputs' span), a layer above the first one only near a stationary
point, where its inputs have stopped moving and weight decay has forgotten those of earlier epochs. A layer that sees
``n`` or fewer directions (a 3×3 convolution's 9 per patch, a 1-unit output) cannot show it: the data may fill them.

:func:`layer_spectra` reports, for every parameter of two or more dimensions (a convolution as ``out × in·k·k``):
the directions its rows live in, how many hold ``SPAN_ENERGY`` of its energy, ``σ_n/σ_1`` and ``σ_{n+1}/σ_1``, and
whether it shows the span (``shows_span``: more than ``n`` directions and ``σ_{n+1}/σ_1 ≤ SPAN_GAP``; the energy
count alone is no test, a few large directions hold 99.9 % long before the rest have settled); ``span_layer`` is the
first that does, in the module's parameter order. :func:`span_gap` is the stopping rule ``exhume train
--span-threshold`` uses. :func:`noise_edge` reads the i.i.d. initialisation's scale from a spectrum, and
:func:`learned_part` keeps what training added above it (kkt's ``denoise``, docs/defaults.md#kkt-denoise).
Attacker-side: it reads the weights only. The evaluator's side (the training inputs' distance to each row space,
near-zero pre-activations) is :mod:`exhume.evaluation.layers`. Measurements: docs/METHODS.md §5 (the span one
layer up), docs/defaults.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from exhume.equations.formulation import theta_squared

#: the share of a layer's energy whose directions are counted (``rank_999``), against n
SPAN_ENERGY = 0.999
#: a layer that sees more than n directions shows the span when σ_{n+1}/σ_1 is at most this (kkt's feature stage uses
#: the same rule: exhume/attacks/kkt/stage.py, where the measurements behind the value are)
SPAN_GAP = 1e-2
#: larger weight tensors are not decomposed (their SVD would cost more than a diagnostic should)
MAX_ELEMENTS = 1 << 24
#: the rank counts singular values above the initialisation's noise edge × this
EDGE_MARGIN = 1.1


def spectrum_row(name: str, w: torch.Tensor, n: int) -> dict[str, Any]:
    """One weight tensor's row: its shape as ``out × in``, its spectrum against ``n`` and whether it shows the span."""
    mat = w.detach().reshape(w.shape[0], -1)
    row: dict[str, Any] = {"name": name, "shape": [int(d) for d in mat.shape], "directions": int(min(mat.shape))}
    if mat.numel() > MAX_ELEMENTS:
        return {**row, "shows_span": False, "why": f"not decomposed: over {MAX_ELEMENTS:,} entries"}
    s = torch.linalg.svdvals(mat.double().cpu())
    energy = (s**2).cumsum(0) / (s**2).sum().clamp_min(1e-300)
    row["rank_999"] = int((energy < SPAN_ENERGY).sum()) + 1
    p = row["directions"]
    if float(s[0]) > 0 and n <= p:
        row["sigma_n"] = float(s[n - 1] / s[0])
        row["sigma_after_n"] = float(s[n] / s[0]) if n < p else None
    if p <= n:
        return {**row, "shows_span": False, "why": f"it sees {p} direction{'' if p == 1 else 's'}, no more than n = {n}: the data may fill them"}
    gap = row.get("sigma_after_n")
    if gap is None or gap > SPAN_GAP:
        return {**row, "shows_span": False, "why": f"σ_{n + 1}/σ_1 = {gap:.2g} is above {SPAN_GAP:g}: its spectrum has not "
                "collapsed to rank ≤ n, the training inputs' span"}
    return {**row, "shows_span": True, "why": f"σ_{n + 1}/σ_1 = {gap:.2g}: its spectrum collapses to rank ≤ n"}


def span_gap(model: nn.Module, n: int) -> float | None:
    """The largest σ_{n+1}/σ_1 over the weight layers that see more than ``n`` directions (None: no such layer): below
    :data:`SPAN_GAP` every one of them shows the training inputs' span (a stopping rule for training, weights only)."""
    gaps = [r.get("sigma_after_n") for r in (spectrum_row(k, w, n) for k, w in model.named_parameters() if w.dim() >= 2)
            if r["directions"] > n]
    gaps = [g for g in gaps if g is not None]
    return max(gaps) if gaps else None


def layer_spectra(model: nn.Module, n: int) -> dict[str, Any]:
    """Each weight tensor's spectrum against ``n`` training points and the first layer that shows their span (weights
    only; see the module docstring): ``{"n", "energy", "layers": [rows], "span_layer", "finding"}``."""
    if int(n) < 1:
        raise ValueError(f"n must be a positive number of training points, got {n}")
    rows = [spectrum_row(name, p, int(n)) for name, p in model.named_parameters() if p.dim() >= 2]
    span = next((r["name"] for r in rows if r["shows_span"]), None)
    return {"n": int(n), "energy": SPAN_ENERGY, "layers": rows, "span_layer": span, "finding": span_finding(rows, span, int(n))}


def span_finding(rows: list[dict[str, Any]], span: str | None, n: int) -> str:
    """One sentence: at which layer the weights show the training inputs' span, or that none does and why."""
    if span is not None:
        row = next(r for r in rows if r["name"] == span)
        first = " (the first weight layer)" if rows and rows[0]["name"] == span else " (a layer above the first)"
        return (f"The weights show the training inputs' span at {span}{first}: σ_{n + 1}/σ_1 = {row['sigma_after_n']:.2g} "
                f"(≤ {SPAN_GAP:g}), {row['rank_999']} directions hold {SPAN_ENERGY:.1%} of its energy, n = {n}.")
    wide = [r for r in rows if r["directions"] > n and r.get("sigma_after_n") is not None]
    if not wide:
        return f"No weight layer sees more than n = {n} directions, so none can show the training inputs' span."
    near = min(wide, key=lambda r: r["sigma_after_n"])
    return (f"No weight layer shows the training inputs' span: at the closest, {near['name']}, σ_{n + 1}/σ_1 = "
            f"{near['sigma_after_n']:.2g} (above {SPAN_GAP:g}) and {near['rank_999']} directions hold {SPAN_ENERGY:.1%} of "
            f"its energy, n = {n} (a layer above the first shows it only near a stationary point).")


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

    Without weight decay gradient descent keeps the random initialisation: ``W = W₀ + Σ_i (…)``, and
    only the sum is what the stationarity equation explains. A hidden layer left at PyTorch's
    default initialisation (Haim's regime shrinks only the first layer's) keeps most of its
    energy there: on a 784-256-256 victim trained without weight decay the 256×256 layer's
    singular values are a Marchenko–Pastur bulk (median 0.47) with two above it, and the 100
    training points explain 24 % of ``‖θ‖²`` (90 % of ``W₀ + Σ`` with that layer's bulk removed).
    Each parameter with two or more dimensions (convolutions flattened to ``out × rest``) whose
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
