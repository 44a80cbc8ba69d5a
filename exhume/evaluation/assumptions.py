"""Does the stationarity attack's model of the victim hold? Evaluator-side checks for the verdict.

The KKT attack inverts ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``, which holds when (a) training ended
at (or near) a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` (or, without weight decay, near the
max-margin KKT point), (b) the network is what the attack differentiates: piecewise-linear
activations (ReLU, leaky ReLU) and no layer whose training-time behaviour differs from its
evaluation-time one (BatchNorm's batch statistics, dropout). When they fail, an attack that finds
nothing says little, so the verdict is *inconclusive* rather than *no evidence*.

**Relative stationarity residual** on the real training data (needs the training set, so only the
evaluator computes it):

- with weight decay ``w > 0``: ``‖∇_θ objective‖ / ‖w·θ‖`` (the number ``exhume train`` reports),
  which equals ``‖θ − Σ_i λ_i ∇_θ(−ℓ_i)‖ / ‖θ‖`` with the exact ``λ_i = 1/(n·w)``;
- without: ``min_{λ ≥ 0} ‖θ − Σ_i λ_i ∇_θ margin_i‖ / ‖θ‖`` (Haim et al.'s KKT condition, the
  best non-negative multipliers by NNLS).

0 is exact stationarity, 1 is no better than ``λ = 0``.

**Thresholds**: ``STATIONARITY_LIMIT = 0.5`` sits above every measured victim trained until its
loss plateaued, ``ATTACK_RESIDUAL_LIMIT = 0.5`` above every attack that converged. A residual below
the limit is necessary, not sufficient (a briefly trained victim without weight decay passes it;
the fit check catches it). Measured by ``benchmarks/audit_thresholds.py``: ``benchmarks/README.md``,
"Audit thresholds".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad
from torch.overrides import TorchFunctionMode

from exhume.attacks.formulation import MARGIN_FORMS
from exhume.files.limits import LIMITS
from exhume.losses import margin

#: victims above this relative stationarity residual on their own training data are "far from a
#: stationary point" (benchmarks/README.md, "Audit thresholds")
STATIONARITY_LIMIT = 0.5
#: attacks whose own final relative residual (exact ReLU derivative) stays above this did not find a KKT point
ATTACK_RESIDUAL_LIMIT = 0.5

_SMOOTH = {F.gelu: "GELU", torch.tanh: "tanh", F.tanh: "tanh", torch.Tensor.tanh: "tanh", torch.sigmoid: "sigmoid",
           F.sigmoid: "sigmoid", torch.Tensor.sigmoid: "sigmoid", F.silu: "SiLU", F.elu: "ELU", F.selu: "SELU",
           F.celu: "CELU", F.softplus: "softplus", F.mish: "Mish", F.hardswish: "hardswish", F.softsign: "softsign",
           F.logsigmoid: "logsigmoid", F.layer_norm: "LayerNorm", F.group_norm: "GroupNorm", torch.exp: "exp",
           torch.Tensor.exp: "exp", F.softmax: "softmax", torch.softmax: "softmax", torch.Tensor.softmax: "softmax"}


class _Recorder(TorchFunctionMode):
    """Records the smooth (non-piecewise-linear) functions a forward pass calls."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = _SMOOTH.get(func)
        if name is not None and name not in self.seen:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def unmodelled_layers(model: nn.Module, sample: torch.Tensor) -> list[str]:
    """Plain-words reasons for each part of ``model`` the attack does not model (empty: none).

    Looks at the modules (BatchNorm, dropout) and traces one forward pass on ``sample`` for
    non-piecewise-linear functions (GELU, tanh, sigmoid, SiLU, LayerNorm, softmax, ...), so
    functional calls inside ``forward`` are seen as well as ``nn`` modules.
    """
    reasons: list[str] = []
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    if norms:
        reasons.append(f"the network has {', '.join(norms)} layers: trained in training mode they use batch statistics, "
                       "so the weights are not a stationary point of the network the attack differentiates")
    drops = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    if drops:
        reasons.append("the network has dropout layers: training with dropout does not end at a stationary point of the "
                       "network without dropout that the attack differentiates")
    rec = _Recorder()
    was_training = model.training
    model.eval()
    with torch.no_grad(), rec:
        model(sample)
    model.train(was_training)
    if rec.seen:
        reasons.append(f"the network uses {', '.join(rec.seen)}, which the attack does not model: it assumes piecewise-linear "
                       "activations such as ReLU (its multiplier scale and ReLU surrogate rely on them)")
    return reasons


def _flat_grads(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample ``∇_θ margin_i`` as the rows of an ``(n, p)`` matrix (a plain loop: any module).

    Written row by row, one parameter tensor's slice at a time (8× faster than columns or a
    ``torch.cat`` per row for a 1.8 M-parameter MLP).
    """
    def one(p, xi, yi):
        return margin(functional_call(model, p, (xi,)), yi).sum()

    out = torch.empty(x.shape[0], sum(v.numel() for v in params.values()), dtype=torch.float64)
    for i in range(x.shape[0]):
        g = grad(one)(params, x[i:i + 1], y[i:i + 1])
        at = 0
        for k in params:
            size = g[k].numel()
            out[i, at:at + size] = g[k].reshape(-1)
            at += size
    return out


def kkt_residual_nnls(model: nn.Module, x: torch.Tensor, y: torch.Tensor, memory: int | None = None) -> float | None:
    """``min_{λ ≥ 0} ‖θ − Σ_i λ_i ∇_θ margin_i‖ / ‖θ‖`` (the no-weight-decay KKT residual).

    The gradients ``G`` (``p × n`` float64) are held whole, with their QR factors, when that fits in
    ``memory`` bytes (default ``LIMITS.gradient_matrix_bytes``; three ``p × n`` matrices); otherwise only their Gram matrix
    ``GᵀG`` (``n × n``) and ``Gᵀθ`` are kept, accumulated from blocks of columns that fit (each
    block's partners recomputed), and the same least-squares problem is solved through the Gram
    matrix's eigendecomposition. A model of 1.8 M parameters trained on 1000 images would need 29 GB
    for ``G`` and its ``Q``; the Gram path holds 8 MB of Gram matrix and the blocks. None (not
    measured) when not even the Gram matrix and its eigenvectors fit in ``memory``.
    """
    from scipy.optimize import nnls

    memory = LIMITS.gradient_matrix_bytes if memory is None else int(memory)
    model = model.double().eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    theta = torch.cat([v.reshape(-1) for v in params.values()])
    x, y = x.double(), (y.double() if y.is_floating_point() else y)
    p, n = theta.numel(), x.shape[0]
    theta2 = float(theta @ theta)
    if 3 * 8 * p * n <= memory:  # G, the copy QR factorises and Q
        g = _flat_grads(model, params, x, y).T  # (p, n), column-major
        q, r = torch.linalg.qr(g, mode="reduced")  # ‖θ − Gλ‖² = ‖Qᵀθ − Rλ‖² + ‖θ‖² − ‖Qᵀθ‖²
        qt = q.T @ theta
        r_np, t_np = r.numpy(), qt.numpy()
    elif 3 * 8 * n * n > memory:
        return None
    else:
        gram, gt = _gram(model, params, theta, x, y, max(1, memory // (2 * 8 * p)))
        s, v = torch.linalg.eigh(gram)  # GᵀG = V S Vᵀ: R = S^½ Vᵀ and Qᵀθ = S^-½ Vᵀ Gᵀθ on S's range
        keep = s > s.max().clamp_min(0) * 1e-10
        root = s[keep].sqrt()
        r_np = (root[:, None] * v[:, keep].T).numpy()
        t_np = ((v[:, keep].T @ gt) / root).numpy()
    _, rnorm = nnls(r_np, t_np, maxiter=50 * r_np.shape[1])
    outside = max(theta2 - float((torch.from_numpy(t_np) ** 2).sum()), 0.0)
    return float((rnorm**2 + outside) ** 0.5 / max(theta2 ** 0.5, 1e-30))


def _gram(model: nn.Module, params: dict[str, torch.Tensor], theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
          block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``GᵀG`` and ``Gᵀθ`` of the per-sample margin gradients ``G``, holding two blocks of ``block`` of them at a time."""
    n = x.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64)
    gt = torch.zeros(n, dtype=torch.float64)
    starts = range(0, n, block)
    for a in starts:
        ga = _flat_grads(model, params, x[a:a + block], y[a:a + block])
        ea = a + ga.shape[0]
        gt[a:ea] = ga @ theta
        gram[a:ea, a:ea] = ga @ ga.T
        for b in starts:
            if b > a:
                gb = _flat_grads(model, params, x[b:b + block], y[b:b + block])
                eb = b + gb.shape[0]
                gram[a:ea, b:eb] = ga @ gb.T
                gram[b:eb, a:ea] = gram[a:ea, b:eb].T
                del gb
        del ga
    return gram, gt


def relative_stationarity(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict:
    """The relative stationarity residual of ``model`` on its training data ``(x, y)`` (model inputs)."""
    import copy

    from exhume.victim.train import stationarity_residual

    work = copy.deepcopy(model).double().eval()
    yy = y.double() if y.is_floating_point() else y
    if weight_decay > 0:
        value = stationarity_residual(work, x.double(), yy, loss, weight_decay)
        how = "‖∇ objective‖ / ‖weight_decay·θ‖ on the training data (0 = stationary)"
    else:
        value = kkt_residual_nnls(work, x, yy)
        how = "min over λ ≥ 0 of ‖θ − Σ λ_i ∇θ margin_i‖ / ‖θ‖ on the training data (no weight decay; 0 = KKT point)"
        if value is None:
            how += (f"; not measured: the Gram matrix of {x.shape[0]} training images' gradients would exceed "
                    f"LIMITS.gradient_matrix_bytes ({LIMITS.gradient_matrix_bytes} bytes)")
    return {"value": None if value is None else float(value), "definition": how, "limit": STATIONARITY_LIMIT}


def stationarity_failure(measured: dict) -> list[str]:
    """The plain-words failure for a measured residual above its limit (empty when below)."""
    value, limit = measured["value"], measured["limit"]
    if value is None:
        return [f"the model's stationarity on its training data could not be checked ({measured['definition']}), "
                "so whether the attack's equation holds is unknown"]
    if value <= limit:
        return []
    return [f"the model is far from a stationary point of its training objective on the given training data "
            f"(relative stationarity residual {value:.3g} > {limit:g}): it was trained too briefly, with other settings "
            "(weight decay, loss, normalisation) than stated, or on other data, and the attack inverts the stationarity equation"]


def attack_failures(recon) -> list[str]:
    """The attack's own final residual, when it reports one, above ``ATTACK_RESIDUAL_LIMIT``.

    A pooled portfolio reports one residual per restart (``final_relative_stationarity_per_restart``):
    it fails when even its best restart stayed above the limit.
    """
    summary = recon.summary or {}
    value = summary.get("final_relative_stationarity")
    what = "its final relative residual"
    if value is None:
        per = [float(v) for v in summary.get("final_relative_stationarity_per_restart") or [] if v is not None]
        if per:
            value, what = min(per), f"the best final relative residual of its {len(per)} restarts"
    if value is None or value <= ATTACK_RESIDUAL_LIMIT:
        return []
    return [f"the attack did not find candidates that satisfy the stationarity equation ({what} "
            f"{value:.3g} > {ATTACK_RESIDUAL_LIMIT:g}); a longer budget or other settings may"]


def fit_failure(margins, weight_decay: float) -> list[str]:
    """Without weight decay the attack assumes the max-margin KKT point: every training image fitted."""
    import numpy as np

    wrong = int(np.sum(np.asarray(margins) <= 0))
    if weight_decay > 0 or wrong == 0:
        return []
    return [f"{wrong} of {len(margins)} training images are not fitted (margin <= 0): a model trained without weight decay "
            "reaches the max-margin point the attack assumes only after fitting all its training data, so it was trained too briefly"]


#: S / (the typical multiplier the training margins imply) where the kkt attack was measured to
#: work on models trained without weight decay (benchmarks/README.md, "λ scale without weight decay")
NO_DECAY_SCALE_RANGE = (0.2, 1.2)


def scale_failure(recon, margins, weight_decay: float) -> list[str]:
    """Without weight decay the kkt attack assumes a margin (``formulation.NO_DECAY_MARGIN``); check it.

    Stationarity gives ``Σ_i λ_i·margin_i = ‖θ‖²/L``, so with the real training margins the typical
    multiplier is ``‖θ‖²/(L·Σ_i margin_i)``. On the zoo's two Haim victims (45-s runs) the attack
    memorised 6–11 training images with ``S`` between 0.2× and 1.2× of it (0.5× best), 2 at
    0.08–0.1×, 1 and 7 at 2–2.4×, and 0 and 2 at 40–48× (the ``S = 1`` used before); outside
    that range finding nothing says little. The rule's ``S`` lay at 0.41–0.61× on all four zoo
    victims trained without weight decay. Not checked (no single ``S``) when pooled restarts used
    different scales.
    """
    import numpy as np

    cfg = getattr(recon, "config", None) or {}
    if weight_decay > 0 or getattr(recon, "method", None) != "kkt" or cfg.get("formulation") not in MARGIN_FORMS or margins is None:
        return []
    s, degree, theta2 = cfg.get("lambda_scale_value"), cfg.get("homogeneity_degree"), cfg.get("theta_squared")
    total = float(np.sum(np.clip(np.asarray(margins, dtype=float), 0.0, None)))
    if s is None or not degree or not theta2 or total <= 0:
        return []
    typical = float(theta2) / (float(degree) * total)
    ratio = float(s) / typical
    lo, hi = NO_DECAY_SCALE_RANGE
    if lo <= ratio <= hi:
        return []
    return [f"the attack's multiplier scale S = {float(s):.3g} is {ratio:.2g}× the typical multiplier this model's training margins "
            f"imply (‖θ‖²/(L·Σ margins) = {typical:.3g}); without weight decay the attack was measured to work between {lo:g}× "
            f"and {hi:g}× of it (benchmarks/README.md), so finding nothing says little. An attacker can try several scales: "
            f"rerun with the attack parameter lambda_scale={typical / 2:.3g} (half the typical multiplier; "
            f"-p lambda_scale={typical / 2:.3g} on the command line)"]
