"""The equation an attack inverts, as an object the evaluation can check on the real training data.

An attack declares its ``equation`` (:class:`~exhume.attacks.base.Attack`); the evaluator, who
holds the training set, asks it which of the attack's assumptions fail for the model at hand:

- :class:`Equation`: the attack inverts no equation of the weights and the training data (model
  inversion): nothing to check;
- :class:`KnownStart`: with the starting weights known, what training added is a sum of the
  training points' gradients (:mod:`exhume.attacks.trajectory`); its residual on the training
  data is the check;
- :class:`ExactRun`: the owner's whole recipe replayed on the training data reproduces the weights
  (to rounding when the recipe is the one that ran);
- :class:`Stationarity`: ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``, which holds when training ended at
  (or near) a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` (without weight decay, near the
  max-margin KKT point) and the network is what the attack differentiates (piecewise-linear
  activations, no layer that trains differently from how it evaluates). Its residual on the
  training data (:func:`relative_stationarity`), the layers (:func:`unmodelled_layers`), the
  fit without weight decay (:func:`fit_failure`) and, for an attack that sets its multipliers'
  scale from the weights alone, that scale (:func:`scale_failure`) are checked.

Nothing here runs during an attack (which never reads the training set): these are the evaluator's
questions, kept beside the attacks so that a new equation is one new object, not a new branch in
the evaluation. Thresholds and their measurements: ``benchmarks/README.md``, "Audit thresholds".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad
from torch.overrides import TorchFunctionMode

from exhume.attacks.formulation import MARGIN_FORMS
from exhume.files.limits import LIMITS
from exhume.losses import margin, relative_objective_gradient

#: models above this relative stationarity residual on their own training data are "far from a stationary point"
STATIONARITY_LIMIT = 0.5
#: S / (the typical multiplier the training margins imply) where the kkt attack was measured to
#: work on models trained without weight decay (benchmarks/README.md, "λ scale without weight decay")
NO_DECAY_SCALE_RANGE = (0.2, 1.2)


@dataclass(frozen=True)
class Equation:
    """No equation of the weights and the training data: no assumption of it to check (the base)."""

    text: str = "none: the attack inverts no equation of the weights and the training data"

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        """Parts of ``model`` the attack's equation does not model, in plain words (empty: none)."""
        return []

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        """How far the real training data ``(x, y)`` (model inputs) are from satisfying the equation:
        ``{"value", "definition", "limit"}`` (value None: not measured)."""
        return {"value": None, "definition": self.text, "limit": None}

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        """The failure, in plain words, of a residual ``measured`` above its limit (empty when none)."""
        return []

    def fit_failures(self, margins, weight_decay: float) -> list[str]:
        """What the training margins say against the equation (empty when nothing)."""
        return []

    def run_failures(self, recon, margins, weight_decay: float) -> list[str]:
        """What the attack's own settings in ``recon`` say against the equation, given the real margins."""
        return []

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        """The attack's own final residual measure with the training data ``(x, y)`` (model inputs) as its candidates,
        multipliers fitted by least squares with the run's settings (``recon.config``): ``{"value", "definition"}``, to
        set beside the attack's best (identifiability); ``measured``: this equation's :meth:`residual` on them, reused
        where it is that measure. None: the run reports no residual of this equation."""
        return None


@dataclass(frozen=True)
class Stationarity(Equation):
    """``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``: training ended at a stationary point (see the module docstring).

    ``multiplier_scale``: the attack sets the multipliers' scale from the weights alone, which the
    evaluator checks against the real training margins (:func:`scale_failure`).
    """

    text: str = "θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i): a stationary point of the training objective"
    multiplier_scale: bool = False
    limit: float = STATIONARITY_LIMIT

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        return unmodelled_layers(model, sample)

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        return {**relative_stationarity(model, x, y, loss, weight_decay), "limit": self.limit}

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        return stationarity_failure(measured)

    def fit_failures(self, margins, weight_decay: float) -> list[str]:
        return fit_failure(margins, weight_decay)

    def run_failures(self, recon, margins, weight_decay: float) -> list[str]:
        return scale_failure(recon, margins, weight_decay) if self.multiplier_scale else []

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        cfg = getattr(recon, "config", None) or {}
        if cfg.get("formulation") is None or (cfg.get("equation_used") or "stationary") != "stationary":
            return None  # a run that recorded no stationarity formulation (e.g. bilevel) reports no such residual
        return stationarity_fit(model, x, y, cfg.get("loss_assumed") or loss, cfg)


@dataclass(frozen=True)
class KnownStart(Equation):
    """What training added from a known start, ``θ_T − c·θ_0 = Σ_i Σ_k λ_ik ∇_θ h(θ^(k); x_i)`` (gradients at the final
    weights, and with ``kind="endpoints"`` at the start too; :mod:`exhume.attacks.trajectory`).

    ``view``: the attacker's view holding the start (None: the start is not at hand, e.g. ``exhume evaluate`` of
    such a run, and the check cannot be made); ``decay``, ``preconditioner``: the attack's settings of ``c`` and
    Adam's ``P``. Its residual is :func:`~exhume.attacks.trajectory.known_start_residual` on the training data.
    """

    text: str = "θ_T − c·θ_0 = Σ_i Σ_k λ_ik ∇_θ h(θ^(k); x_i): what training added to the known starting weights"
    view: Any = None
    kind: str = "endpoints"
    decay: Any = "auto"
    preconditioner: str = "auto"
    limit: float = STATIONARITY_LIMIT
    formulation: str = "auto"  # the attack's h and, with ``nonnegative``, its multipliers' sign: the residual uses the same
    nonnegative: bool = True
    attack_residual: bool = True  # the run's final residual is this equation's (False: another quantity, e.g. simulate's)

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        # eval-mode BatchNorm is modelled (its affine part in the equation, the running statistics fixed): whether
        # the equation holds with it is what the residual measures (benchmarks/README.md, "Known start: which equation")
        return unmodelled_layers(model, sample, batchnorm=False)

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        if self.view is None or getattr(self.view, "start", None) is None:
            return {"value": None, "definition": f"{self.text} (the starting weights are not at hand here)", "limit": self.limit}
        from exhume.attacks.trajectory import known_start_residual

        got = known_start_residual(self.view, x, y, self.kind, self.decay, self.preconditioner, self.formulation, self.nonnegative)
        return {"value": got["value"], "definition": got["definition"], "limit": self.limit}

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        if not self.attack_residual or measured.get("value") is None:
            return None
        return {"value": measured["value"], "definition": measured["definition"]}  # the check is the attack's measure

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        value, limit = measured["value"], measured["limit"]
        if value is None:
            return ["the known-start equation could not be checked on the training data (the starting weights are not at "
                    "hand), so whether the attack's equation holds is unknown"]
        if value <= limit:
            return []
        return [f"even with the starting weights known, the training images' gradients explain little of what training added "
                f"(relative residual {value:.3g} > {limit:g}): the start, the weight decay or the optimiser differ from what was "
                "stated (Adam without its state is preconditioned differently), or the model was trained on other data"]


#: the exact run's relative gap at the training data above which the stated recipe does not reproduce the weights
EXACT_LIMIT = 1e-2


@dataclass(frozen=True)
class ExactRun(Equation):
    """``θ_T = Run(θ_0; x_1 … x_n)``: the owner's whole recipe replayed from the start (:mod:`exhume.attacks.exact`).

    ``view``: the attacker's view with the start and the recipe (None: not at hand, the check cannot be made). Its
    residual is :func:`~exhume.attacks.exact.exact_residual`: 0 up to rounding when the recipe is the one that ran.
    """

    text: str = "θ_T = Run(θ_0; x_1 … x_n): the owner's recipe replayed exactly from the start"
    view: Any = None
    limit: float = EXACT_LIMIT

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        from exhume.attacks.exact import train_mode_failures

        return train_mode_failures(model)

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        if self.view is None or getattr(self.view, "start", None) is None:
            return {"value": None, "definition": f"{self.text} (the starting weights are not at hand here)", "limit": self.limit}
        from exhume.attacks.exact import exact_residual

        got = exact_residual(self.view, x, y)
        return {"value": got["value"], "definition": got["definition"], "limit": self.limit}

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        if measured.get("value") is None:
            return None
        return {"value": measured["value"], "definition": measured["definition"]}  # the attack's own measure, hard labels

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        value, limit = measured["value"], measured["limit"]
        if value is None:
            return ["the exact run could not be replayed on the training data (the starting weights are not at hand), so "
                    "whether the stated recipe is the one that ran is unknown"]
        if value <= limit:
            return []
        return [f"the stated recipe replayed on the training images does not reproduce the weights (relative gap {value:.3g} "
                f"> {limit:g}): a setting differs from the run that made them (optimiser, learning rate, momentum or betas, "
                "weight decay, batch size, epochs, the sampler's seed, the loss or the normalisation), or the data do"]


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


def unmodelled_layers(model: nn.Module, sample: torch.Tensor, batchnorm: bool = True) -> list[str]:
    """Plain-words reasons for each part of ``model`` the attack does not model (empty: none).

    Looks at the modules (BatchNorm, dropout) and traces one forward pass on ``sample`` for
    non-piecewise-linear functions (GELU, tanh, sigmoid, SiLU, LayerNorm, softmax, ...), so
    functional calls inside ``forward`` are seen as well as ``nn`` modules.
    """
    reasons: list[str] = []
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    if norms and batchnorm:
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


def stationarity_fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str | None, cfg: dict[str, Any],
                     memory: int | None = None) -> dict[str, Any]:
    """``min_λ ‖t − Σ_i λ_i ∇_θ h(x_i, y_i)‖² / ‖t‖²`` at the training data: the kkt run's final residual measure
    (``cfg``: its config; ``h`` its formulation, λ ≥ 0 but for ``output``, ``t`` = θ or, where the run denoised, the
    learned part for its ``n_guess``), by least squares in float64 (:func:`~exhume.attacks.trajectory.explained`).
    Value None when the ``n × p`` gradients (three copies) exceed ``memory`` (``LIMITS.gradient_matrix_bytes``)."""
    from exhume.attacks.formulation import objective_for
    from exhume.attacks.stationarity import gram_least_squares
    from exhume.attacks.subspace import learned_part
    from exhume.attacks.trajectory import StartEquation, per_sample
    from exhume.attacks.workcopy import attack_model

    form = cfg["formulation"]
    how = (f"min over λ {'signed' if form == 'output' else '≥ 0'} of ‖t − Σ_i λ_i ∇θ h(x_i)‖² / ‖t‖² at the training "
           f"images (h: the {form} formulation; t: θ")
    work, params = attack_model(model, "cpu", torch.float64)
    size = sum(v.numel() for v in params.values())
    memory = LIMITS.gradient_matrix_bytes if memory is None else int(memory)
    if 4 * size * len(x) > memory:  # the gradients are kept in float32
        return {"value": None, "definition": how + f"); not measured: {len(x)} images' gradients of {size} parameters "
                f"exceed LIMITS.gradient_matrix_bytes ({memory} bytes)"}
    target = None
    if (cfg.get("denoise") or "off") != "off":
        target, _ = learned_part(params, int(cfg.get("n_guess") or len(x)))
        how += ", its part above the initialisation's noise, as the run used" if target is not None else ""
    target = params if target is None else target
    eq = StartEquation(tuple(params), [params], target, None, 1.0)
    objective = objective_for(form, loss, "classification" if form != "output" else "regression")  # the run validated it
    jac = torch.cat([per_sample(work, eq, x[s:s + 32].double(), y[s:s + 32], objective).float() for s in range(0, len(x), 32)])
    t = torch.cat([target[k].reshape(-1) for k in params]).double()
    gram, jt = torch.zeros(len(x), len(x), dtype=torch.float64), torch.zeros(len(x), dtype=torch.float64)
    for c in range(0, size, 1 << 16):  # J Jᵀ and J t in float64, a slice of columns at a time
        part = jac[:, c:c + (1 << 16)].double()
        gram += part @ part.T
        jt += part @ t[c:c + (1 << 16)]
    lam = gram_least_squares(gram, jt, nonnegative=form != "output")
    t2 = float(t @ t)
    rest = max(t2 - 2 * float(lam @ jt) + float(lam @ gram @ lam), 0.0)  # ‖t − Jᵀλ‖², J in float32
    return {"value": rest / t2, "definition": how + "; gradients in float32)"}


def relative_stationarity(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict:
    """The relative stationarity residual of ``model`` on its training data ``(x, y)`` (model inputs)."""
    import copy

    work = copy.deepcopy(model).double().eval()
    yy = y.double() if y.is_floating_point() else y
    if weight_decay > 0:
        value = relative_objective_gradient(work, x.double(), yy, loss, weight_decay)
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



def fit_failure(margins, weight_decay: float) -> list[str]:
    """Without weight decay the attack assumes the max-margin KKT point: every training image fitted."""
    import numpy as np

    wrong = int(np.sum(np.asarray(margins) <= 0))
    if weight_decay > 0 or wrong == 0:
        return []
    return [f"{wrong} of {len(margins)} training images are not fitted (margin <= 0): a model trained without weight decay "
            "reaches the max-margin point the attack assumes only after fitting all its training data, so it was trained too briefly"]



def scale_failure(recon, margins, weight_decay: float) -> list[str]:
    """Without weight decay the kkt attack assumes a margin (``formulation.NO_DECAY_MARGIN``); check it.

    Stationarity gives ``Σ_i λ_i·margin_i = ‖θ‖²/L``, so with the real training margins the typical
    multiplier is ``‖θ‖²/(L·Σ_i margin_i)``; outside ``NO_DECAY_SCALE_RANGE`` times it the attack
    was measured to find little (``benchmarks/README.md``, "λ scale without weight decay"), so
    finding nothing says little. Checked only for the margin formulations, and not (no single
    ``S``) when pooled restarts used different scales.
    """
    import numpy as np

    cfg = getattr(recon, "config", None) or {}
    if weight_decay > 0 or cfg.get("formulation") not in MARGIN_FORMS or margins is None:
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
