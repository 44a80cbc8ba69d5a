"""The published reference recipe of the stationarity attack, written from its description (issue 10).

Unknowns: ``m = 2n`` candidates ``x̂_j`` (mean-subtracted pixels) with fixed labels ``y_j`` (half +1,
half −1; multiclass: spread evenly over the classes, margin ``Φ_y − max_{k≠y} Φ_k``) and
multipliers ``λ_j``. Loss::

    Σ over parameter tensors ‖θ − (1/m) Σ_j λ_j y_j ∇_θ Φ(x̂_j)‖²
    + Σ (x̂ − 1)₊² + (−1 − x̂)₊²          (on the mean-subtracted pixels)
    + 5 · Σ_j (λ_min − λ_j)₊²

``x̂ ~ N(0,1)·1.74e-3``, ``λ ~ U(0,1)``; SGD with momentum 0.9 for both, lr 0.282 for ``x̂`` and 1e-4
for ``λ``; ReLU derivative ``sigmoid(19.2·z)``; float64; ``λ_min = 0.415``. No weight-decay scale,
no averaging, the last iterate is returned.

The stationarity term is :func:`exhume.equations.stationarity.stationarity_residual` with weights
``λ_j / m`` and the margin objective (``y_j Φ(x̂_j)`` for binary outputs): the same sum over
parameter tensors, computed through torch.func (``tests/test_zoo_reference.py`` checks it against
a hand computation on a tiny model).
"""

from __future__ import annotations

import time

import torch

from exhume.attacks.engine.base import Reconstruction, attack_model
from exhume.attacks.engine.record import RunRecord
from exhume.equations.formulation import candidate_labels
from exhume.equations.stationarity import stationarity_residual
from exhume.losses import margin

RECIPE = {"init_scale": 1.74e-3, "lr_x": 0.282, "lr_lambda": 1e-4, "momentum": 0.9, "alpha": 19.2,
          "lambda_min": 0.415, "dual_weight": 5.0, "dtype": "float64"}


def reference_loss(model, params, x, y, lam, alpha: float | None = RECIPE["alpha"],
                   lambda_min: float = RECIPE["lambda_min"]) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe's loss and its stationarity term, for centred candidates ``x`` and multipliers ``lam``."""
    m = x.shape[0]
    stat = stationarity_residual(model, params, x, y, lam / m, alpha, margin)
    prior = (torch.relu(x - 1) ** 2 + torch.relu(-1 - x) ** 2).sum()
    dual = (torch.relu(lambda_min - lam) ** 2).sum()
    return stat + prior + RECIPE["dual_weight"] * dual, stat


def run_reference(view, seconds: float, iterations: int = 10_000_000, seed: int = 0, n: int | None = None,
                  log_every: int = 500, device: str = "cpu") -> Reconstruction:
    """Run the recipe on ``view`` (an AttackerView) for ``seconds`` of wall time or ``iterations`` steps, on ``device``
    (the starting point is drawn on the CPU: the same on every device)."""
    dtype = torch.float64
    model, params = attack_model(view.model, device, dtype)
    n = n or view.n_train_hint or 100
    m = 2 * n
    y = candidate_labels(view.task, m, view.num_classes, dtype).to(device)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, *view.input_shape, generator=gen, dtype=dtype) * RECIPE["init_scale"]).to(device).requires_grad_()
    lam = torch.rand(m, generator=gen, dtype=dtype).to(device).requires_grad_()
    opt_x = torch.optim.SGD([x], lr=RECIPE["lr_x"], momentum=RECIPE["momentum"])
    opt_l = torch.optim.SGD([lam], lr=RECIPE["lr_lambda"], momentum=RECIPE["momentum"])
    history, t0, done, diverged = [], time.perf_counter(), 0, None
    for it in range(1, iterations + 1):
        loss, stat = reference_loss(model, params, x, y, lam)
        if not torch.isfinite(loss):
            diverged = it
            break
        opt_x.zero_grad(set_to_none=True)
        opt_l.zero_grad(set_to_none=True)
        loss.backward()
        opt_x.step()
        opt_l.step()
        done = it
        if it % log_every == 0 or it == 1:
            history.append({"iteration": it, "loss": float(loss.detach()), "stationarity": float(stat.detach()),
                            "seconds": round(time.perf_counter() - t0, 3)})
        if time.perf_counter() - t0 >= seconds:
            break
    with torch.no_grad():
        cands = (x.detach().cpu() + view.mean.to(dtype)).float()
        cands = torch.nan_to_num(cands, nan=0.0)
    return Reconstruction(method="reference-recipe", candidates=cands, labels=y.cpu(), scores=lam.detach().float().cpu(),
                          record=RunRecord(iterations=done, seconds=round(time.perf_counter() - t0, 3), settings={**RECIPE, "m": m, "n_guess": n},
                                           extras={"diverged_at": diverged}), seed=seed, loss_history=history)
