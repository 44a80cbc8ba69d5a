"""What the records an informed adversary knows leave of an equation, and how much one record explains of it.

Every equation here is linear in its multipliers, one column ``∇_θ h(θ^(k); x_i)`` per record and gradient point;
with records known but not their multipliers, what they cannot explain is the projection off their columns' span
(:class:`Remainder`), and a candidate is scored by the share of it its own columns explain (:func:`explained`).
Weights (and a known start) only. docs/METHODS.md §7.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exhume.equations.stationarity import Objective, per_candidate_gradients
from exhume.equations.trajectory import StartEquation, per_sample
from exhume.errors import ConfigError
from exhume.files.limits import LIMITS


@dataclass
class Remainder:
    """The span of the known records' columns over the parameters ``names`` (an orthonormal ``basis``, ``(P, r)``)."""

    names: tuple[str, ...]
    basis: torch.Tensor
    known: int

    def flat(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([d[k].reshape(-1) for k in self.names])

    def perp(self, v: torch.Tensor) -> torch.Tensor:
        """``v`` (or each row of ``v``) projected off the known records' span."""
        return v - (v @ self.basis) @ self.basis.T

    def norm2(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        """``‖P⊥·d‖²`` of a dict of tensors over :attr:`names`."""
        r = self.perp(self.flat(d))
        return (r * r).sum()


def columns(model, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, objective: Objective,
            eq: StartEquation | None = None) -> torch.Tensor:
    """The records' columns ``(k, K, P)``: ``∇_θ h`` at each gradient point (one without an equation of the start),
    flattened over the equation's parameters (``eq.names``, or all of ``params``). ``x`` centred."""
    size = sum(params[k].numel() for k in (eq.names if eq is not None else params)) * x.shape[0]
    size *= 1 if eq is None else eq.multipliers
    if size * params[next(iter(params))].element_size() > LIMITS.gradient_matrix_bytes:
        raise ConfigError(f"{x.shape[0]} records' gradients over this model need {size} numbers, more than "
                          f"{LIMITS.gradient_matrix_bytes} bytes: give fewer known records or candidates")
    chunks = []
    for i in range(0, x.shape[0], 64):
        xs, ys = x[i:i + 64], y[i:i + 64]
        if eq is None:
            chunks.append(per_candidate_gradients(model, params, xs, ys, objective)[:, None])
        else:
            g = per_sample(model, eq, xs, ys, objective)
            chunks.append(g.reshape(eq.multipliers, xs.shape[0], -1).permute(1, 0, 2))
    return torch.cat(chunks).detach()


def remainder_of(model, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, objective: Objective,
                 eq: StartEquation | None = None) -> Remainder:
    """The known records' span (``x`` centred), with the start's direction where ``eq`` fits its decay."""
    names = tuple(eq.names) if eq is not None else tuple(params)
    cols = columns(model, params, x, y, objective, eq).reshape(-1, sum(params[k].numel() for k in names))
    if eq is not None and eq.direction is not None:
        cols = torch.cat([cols, torch.cat([eq.direction[k].reshape(-1) for k in names])[None]])
    return Remainder(names, orthonormal(cols), int(x.shape[0]))


def orthonormal(cols: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis ``(P, r)`` of the rows of ``cols`` ``(c, P)``, from their Gram matrix's eigenvectors (P ≫ c:
    cheaper than a QR of the tall matrix); directions with an eigenvalue under 1e-12 of the largest add nothing."""
    c = cols.double()
    vals, vecs = torch.linalg.eigh(c @ c.T)
    keep = vals > 1e-12 * vals.max().clamp_min(1e-300)
    return (c.T @ (vecs[:, keep] / vals[keep].sqrt())).to(cols.dtype)


def explained(rem: Remainder, target: torch.Tensor, cols: torch.Tensor, signed: bool,
              given: torch.Tensor | None = None) -> torch.Tensor:
    """Each candidate's share of ``‖P⊥·target‖²`` that its columns ``cols`` ``(k, K, P)`` explain: by least squares over
    its ``K`` multipliers (``signed``: of any sign, else non-negative with ``K = 1``), or with its multiplier ``given``
    ``(k,)``: ``(2λ⟨c⊥, t⊥⟩ − λ²‖c⊥‖²) / ‖t⊥‖²`` (negative where the column adds more than it explains)."""
    t = rem.perp(target)
    t2 = (t * t).sum()
    c = rem.perp(cols.reshape(-1, cols.shape[-1])).reshape(cols.shape)
    inner = c @ t  # (k, K)
    if given is not None:
        if cols.shape[1] != 1:
            raise ConfigError("given multipliers need one gradient point per candidate")
        lam = given.to(t)
        return (2 * lam * inner[:, 0] - lam**2 * (c[:, 0] ** 2).sum(-1)) / t2
    gram = c @ c.transpose(1, 2)  # (k, K, K)
    eye = torch.eye(cols.shape[1], dtype=t.dtype, device=t.device)
    scale = (cols.to(t) ** 2).sum((1, 2))  # the ridge is relative to the columns before projection: one in the span explains 0
    coef = torch.linalg.solve(gram + 1e-12 * scale[:, None, None] * eye, inner[..., None])
    share = (inner[..., None] * coef).sum((1, 2)) / t2
    if not signed and cols.shape[1] == 1:
        share = torch.where(inner[:, 0] > 0, share, torch.zeros_like(share))
    return share
