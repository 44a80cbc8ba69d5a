"""The span of the training inputs, read from the victim's first layer, and projecting candidates onto it.

If a network's input enters through one linear map ``z = W·x (+ b)`` (an MLP's first layer, on the
flattened, centred input), every gradient step on ``W`` adds ``Σ_i δ_i x_iᵀ``: rows in the span of
the training inputs. So ``W`` is its initialisation (shrunk by weight decay) plus a matrix whose
row space is the training data's span, plain in ``W``'s singular values where the initialisation
has decayed or was small. The stationarity equation alone leaves candidates free in the other
directions, and that freedom is spent on noise.

:func:`data_subspace` finds that span from the weights alone: it checks that a 2-D parameter
really is the map the input enters through (by the gradients' algebra, for any ``nn.Module``:
:func:`input_layer`), then keeps the right singular vectors whose singular values stand above
``W``'s noise, the larger of two floors:

- **the initialisation** (i.i.d. entries, shrunk by weight decay: Marchenko–Pastur singular
  values), its scale read from ``W``'s lowest ``p − max(n_guess, p/2)`` singular values by median
  ratio against a seeded Gaussian matrix of the same shape (:func:`exhume.equations.span.noise_edge`); floor: its
  largest singular value × ``EDGE_MARGIN``;
- **the precision**: ``FLOOR_EPS`` (10) machine epsilons of the victim's dtype times ``W``'s
  largest singular value (long float32 training leaves rounding noise of no such shape).

There is no span where the data could fill the spectrum (``n_guess ≥ p``), where nothing stands
above the floor, or where the initialisation's noise (``σ²·h·d``) still holds more than
``MAX_NOISE_SHARE`` (10 %) of ``‖W‖²`` (PyTorch's default initialisation without weight decay). The
rule assumes an i.i.d. initialisation; a first layer that started from pretrained weights breaks it
(``subspace="off"``). Data directions weaker than the floor are lost. :class:`Subspace` projects in
centred input space, ``x̂ ← V Vᵀ x̂``; the kkt attack applies it to the initial candidates and after
every step (``subspace="auto"``) and records why where there is no span. Measurements:
``docs/defaults.md#kkt-subspace``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.equations.span import EDGE_MARGIN, noise_share
from exhume.equations.workcopy import remembered

#: the precision floor of trained weights: this many machine epsilons of their largest singular value
FLOOR_EPS = 10.0
#: no span where the initialisation's noise holds more than this share of the layer's energy
MAX_NOISE_SHARE = 0.1
#: relative tolerance of the check that a parameter is the input's linear map
LAYER_TOLERANCE = 1e-6


@dataclass
class Subspace:
    """An orthonormal basis ``(d, k)`` of the span, or none (``basis`` None), and how it was chosen."""

    basis: torch.Tensor | None
    info: dict[str, Any] = field(default_factory=dict)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``V Vᵀ x̂`` for centred candidates ``(m, *input_shape)`` (``x`` itself without a basis)."""
        if self.basis is None:
            return x
        b = self.basis.to(x.dtype)
        flat = x.reshape(x.shape[0], -1)
        return ((flat @ b) @ b.T).reshape(x.shape)


def input_layer(model: nn.Module, params: dict[str, torch.Tensor], input_shape: tuple[int, ...],
                seed: int = 0) -> str | None:
    """The name of the 2-D parameter ``W`` the flattened input enters through (``z = W·x + b``), or None.

    Checked, not guessed from the module's structure: at random inputs, if the output depends on
    ``x`` only through ``W·x``, the gradients satisfy ``∇_W f = g xᵀ`` and ``∇_x f = Wᵀ g`` for one
    vector ``g``. Every 2-D parameter with ``d = prod(input_shape)`` columns is tried in order.
    """
    d = math.prod(int(s) for s in input_shape)
    names = [k for k, w in params.items() if w.dim() == 2 and w.shape[1] == d]
    if not names:
        return None
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64
    p64 = {k: v.detach().to(dtype) for k, v in params.items()}
    model64 = copy.deepcopy(model).to(dtype)
    for name in names:
        if all(_layer_check(model64, p64, name, input_shape, gen) for _ in range(2)):
            return name
    return None


def remembered_input_layer(victim: nn.Module, model: nn.Module, params: dict[str, torch.Tensor],
                           input_shape: tuple[int, ...]) -> str | None:
    """:func:`input_layer` of ``model``, the attack's working copy of the module ``victim``, checked once per victim state
    (:func:`exhume.equations.workcopy.remembered`: a sizing probe and the restarts of a portfolio pay for it once)."""
    shape = tuple(int(s) for s in input_shape)
    return remembered(victim, params, ("input_layer", shape), lambda: input_layer(model, params, shape))


def _layer_check(model: nn.Module, params: dict[str, torch.Tensor], name: str, input_shape: tuple[int, ...],
                 gen: torch.Generator) -> bool:
    dev = params[name].device
    x = torch.randn(1, *input_shape, generator=gen, dtype=torch.float64).to(dev)
    weights = None

    def f(p, xx):
        out = functional_call(model, p, (xx,))
        nonlocal weights
        if weights is None:
            weights = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dev)
        return (out * weights).sum()

    try:
        gp, gx = grad(f, argnums=(0, 1))(params, x)
    except Exception:  # a module torch.func cannot differentiate: no fast path, the attack runs without
        return False
    gw, xf = gp[name], x.reshape(-1)
    if not bool(gw.abs().sum() > 0):  # the output does not move with W here (dead units): no evidence either way
        return False
    g = gw @ xf / (xf @ xf)
    scale = float(gw.norm() * xf.norm()) + 1e-300
    if float((gw - torch.outer(g, xf)).norm()) > LAYER_TOLERANCE * scale:
        return False
    gxf = gx.reshape(-1)
    return float((gxf - params[name].T @ g).norm()) <= LAYER_TOLERANCE * (float(params[name].norm() * g.norm()) + 1e-300)


def data_subspace(model: nn.Module, params: dict[str, torch.Tensor], input_shape: tuple[int, ...],
                  n_guess: int, precision: torch.dtype | None = None) -> Subspace:
    """The training inputs' span as the victim's first layer shows it (see the module docstring).

    ``precision``: the dtype the victim was trained in (default: the parameter's own), whose
    machine epsilon sets the precision floor.
    """
    name = input_layer(model, params, input_shape)
    if name is None:
        return Subspace(None, {"subspace_used": "none", "subspace_reason": "the input does not enter through one linear map "
                               "(e.g. a convolution first), so its weights do not show the data's span"})
    w = params[name].detach()
    _, s, vh = torch.linalg.svd(w.double().cpu(), full_matrices=False)
    p = s.numel()
    info: dict[str, Any] = {"subspace_layer": name, "subspace_dims": int(w.shape[1])}
    noise = noise_share(s, tuple(w.shape), n_guess)
    if noise is None:
        return Subspace(None, {**info, "subspace_used": "none", "subspace_reason": f"the training data (n_guess {n_guess}) "
                               f"may fill all {p} directions {name} sees, so its weights do not single out a span"})
    edge, share = noise
    info["subspace_noise_share"] = share
    if share > MAX_NOISE_SHARE:
        return Subspace(None, {**info, "subspace_used": "none", "subspace_reason": f"the initialisation still holds "
                               f"{share:.0%} of {name}'s energy, so the training data's directions are buried in it"})
    floor = FLOOR_EPS * torch.finfo(precision or w.dtype).eps * float(s[0])
    cut = max(EDGE_MARGIN * edge, floor)
    k = int((s > cut).sum())
    if not 0 < k < p:
        return Subspace(None, {**info, "subspace_used": "none", "subspace_reason": f"{k} of {name}'s {p} singular values "
                               f"lie above its noise ({cut:.3g})"})
    info.update(subspace_used="above-noise", subspace_rank=k, subspace_cut=cut,
                subspace_cut_by="initialisation" if EDGE_MARGIN * edge >= floor else "precision")
    return Subspace(vh[:k].T.contiguous().to(w.device, w.dtype), info)
