"""Does the attack's model of the victim hold? The checks of an attack's equation, for the verdict.

An attack declares the equation it inverts as a description (:mod:`exhume.equations.kinds`);
:func:`equation_of` gives it, :func:`checks_for` the checks of its type (:data:`CHECKS`, a new
equation registers its own), which read the real training data (evaluator side). When they fail, an
attack that finds nothing says little, so the verdict is *inconclusive* rather than *no evidence*.

The stationarity equation ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)`` holds when (a) training ended at (or
near) a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` (or, without weight decay, near the max-margin KKT
point, every training image fitted), (b) the network is what the attack differentiates: piecewise-linear
activations and no layer whose training-time behaviour differs from its evaluation-time one (BatchNorm's
batch statistics, dropout), and (c) for an attack that sets its multipliers' scale from the weights
alone, that scale is near what the real margins imply. Its **relative stationarity residual** on the real
training data (:mod:`exhume.evaluation.residuals`): with weight decay ``‖∇_θ objective‖ / ‖w·θ‖``,
without ``min_{λ ≥ 0} ‖θ − Σ_i λ_i ∇_θ margin_i‖ / ‖θ‖``; 0 is exact stationarity, 1 no better than λ = 0.

**Thresholds**: ``STATIONARITY_LIMIT = 0.5`` sits above every measured victim trained until its loss
plateaued, ``ATTACK_RESIDUAL_LIMIT = 0.5`` above every attack that converged. A residual below the limit is
necessary, not sufficient (a briefly trained victim without weight decay passes it; the fit check catches
it). Measured by ``benchmarks/audit_thresholds.py``: docs/defaults.md#audit-stationarity-limit.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from exhume.equations.formulation import MARGIN_FORMS
from exhume.equations.kinds import Equation, ExactRun, KnownStart, Stationarity
from exhume.evaluation.residuals import relative_stationarity

#: models above this relative stationarity residual on their own training data are "far from a stationary point"
STATIONARITY_LIMIT = 0.5
#: the exact run's relative gap at the training data above which the stated recipe does not reproduce the weights
EXACT_LIMIT = 1e-2
#: S / (the typical multiplier the training margins imply) where the kkt attack was measured to
#: work on models trained without weight decay (docs/defaults.md#audit-scale-check-without-weight-decay)
NO_DECAY_SCALE_RANGE = (0.2, 1.2)
#: attacks whose own final relative residual (exact ReLU derivative) stays above this did not find a KKT point
ATTACK_RESIDUAL_LIMIT = 0.5


class Checks:
    """The checks of ``equation`` on the real training data; this base, an equation that inverts nothing: none."""

    limit: ClassVar[float | None] = None  # the residual's limit (None: no residual)

    def __init__(self, equation: Equation) -> None:
        self.equation = equation

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        """Parts of ``model`` the attack's equation does not model, in plain words (empty: none)."""
        return []

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        """How far the real training data ``(x, y)`` (model inputs) are from satisfying the equation:
        ``{"value", "definition", "limit"}`` (value None: not measured)."""
        return {"value": None, "definition": self.equation.text, "limit": self.limit}

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
        multipliers fitted by least squares with the run's settings: ``{"value", "definition"}``, to set beside the
        attack's best (:mod:`exhume.evaluation.identifiability`); ``measured``: this equation's :meth:`residual` on
        them, reused where it is that measure. None: the run reports no residual of this equation."""
        return None


class StationarityChecks(Checks):
    """The stationarity equation's: its layers, its residual, the fit without weight decay, the multipliers' scale."""

    limit = STATIONARITY_LIMIT

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        return unmodelled_layers(model, sample)

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        return {**relative_stationarity(model, x, y, loss, weight_decay), "limit": self.limit}

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        return stationarity_failure(measured)

    def fit_failures(self, margins, weight_decay: float) -> list[str]:
        return fit_failure(margins, weight_decay)

    def run_failures(self, recon, margins, weight_decay: float) -> list[str]:
        return scale_failure(recon, margins, weight_decay) if self.equation.multiplier_scale else []

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        from exhume.evaluation.residuals import stationarity_fit

        record = recon.record
        form = record.settings.get("formulation")
        if form is None or not record.equation.stationary:
            return None  # a run that recorded no stationarity formulation (e.g. bilevel) reports no such residual
        return stationarity_fit(model, x, y, record.settings.get("loss_assumed") or loss, form,
                                record.settings.get("denoise") or "off", record.n_guess)


class _StartChecks(Checks):
    """What the known-start and the exact-run checks share: a residual that needs the start, the attack's own measure."""

    limit = STATIONARITY_LIMIT
    unknown = "whether the attack's equation holds is unknown"  # the failure when the start is not at hand

    def residual(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict[str, Any]:
        view = self.equation.view
        if view is None or getattr(view, "start", None) is None:
            return {"value": None, "definition": f"{self.equation.text} (the starting weights are not at hand here)", "limit": self.limit}
        got = self.measure(view, x, y)
        return {"value": got["value"], "definition": got["definition"], "limit": self.limit}

    def measure(self, view, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def fit_at_truth(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any],
                     recon) -> dict[str, Any] | None:
        if not getattr(self.equation, "attack_residual", True) or measured.get("value") is None:
            return None
        return {"value": measured["value"], "definition": measured["definition"]}  # the check is the attack's own measure

    def residual_failures(self, measured: dict[str, Any]) -> list[str]:
        value, limit = measured["value"], measured["limit"]
        if value is None:
            return [self.unknown]
        return [] if value <= limit else [self.above(value, limit)]

    def above(self, value: float, limit: float) -> str:
        raise NotImplementedError


class KnownStartChecks(_StartChecks):
    """The known-start equation's: its layers (eval-mode BatchNorm is modelled), its residual at the training data."""

    unknown = ("the known-start equation could not be checked on the training data (the starting weights are not at "
               "hand), so whether the attack's equation holds is unknown")

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        # eval-mode BatchNorm is modelled (its affine part in the equation, the running statistics fixed): whether
        # the equation holds with it is what the residual measures (docs/defaults.md#kkt-start_equation)
        return unmodelled_layers(model, sample, batchnorm=False)

    def measure(self, view, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        from exhume.evaluation.residuals import known_start_residual

        eq = self.equation
        return known_start_residual(view, x, y, eq.kind, eq.decay, eq.preconditioner, eq.formulation, eq.nonnegative)

    def above(self, value: float, limit: float) -> str:
        return (f"even with the starting weights known, the training images' gradients explain little of what training added "
                f"(relative residual {value:.3g} > {limit:g}): the start, the weight decay or the optimiser differ from what was "
                "stated (Adam without its state is preconditioned differently), or the model was trained on other data")


class ExactRunChecks(_StartChecks):
    """The exact run's: the layers the replay cannot run as training ran them, the recipe replayed on the training data."""

    limit = EXACT_LIMIT
    unknown = ("the exact run could not be replayed on the training data (the starting weights are not at hand), so "
               "whether the stated recipe is the one that ran is unknown")

    def layer_failures(self, model: nn.Module, sample: torch.Tensor) -> list[str]:
        from exhume.equations.exact import train_mode_failures

        return train_mode_failures(model)

    def measure(self, view, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        from exhume.evaluation.residuals import exact_run_residual

        return exact_run_residual(view, x, y)

    def above(self, value: float, limit: float) -> str:
        return (f"the stated recipe replayed on the training images does not reproduce the weights (relative gap {value:.3g} "
                f"> {limit:g}): a setting differs from the run that made them (optimiser, learning rate, momentum or betas, "
                "weight decay, batch size, epochs, the sampler's seed, the loss or the normalisation), or the data do")


#: the checks of each kind of equation; a subclass of an equation is checked as its nearest registered base
CHECKS: dict[type[Equation], type[Checks]] = {Equation: Checks, Stationarity: StationarityChecks,
                                              KnownStart: KnownStartChecks, ExactRun: ExactRunChecks}


def checks_for(equation: Equation) -> Checks:
    """The checks of ``equation``'s type (:data:`CHECKS`, by its nearest registered class)."""
    kind = next(k for k in type(equation).__mro__ if k in CHECKS)
    return CHECKS[kind](equation)


def equation_of(method: str, view=None, attack_args: dict | None = None, recon=None) -> Equation:
    """The equation the attack ``method`` declares; for an attack not registered here, every check of
    the stationarity equation (a judgement never loosened by not knowing the attack).

    ``view`` (with ``attack_args``): the one a run of the attack with those settings inverts on that
    attacker's view (a known start changes it). ``recon``: the one a finished run recorded; a run
    on the known-start equation is checked by that equation, which needs the start (``view``)."""
    from exhume.attacks import ATTACKS, Attack

    if method not in ATTACKS:
        return Attack.equation
    if view is not None:
        return ATTACKS[method].of_settings(attack_args).equation_on(view)
    kind = recon.record.equation.known_start_kind if recon is not None else None
    if kind is not None:
        return KnownStart(kind=kind)
    return ATTACKS[method].equation


def attack_failures(recon) -> list[str]:
    """The attack's own final residual, when it reports one, above ``ATTACK_RESIDUAL_LIMIT``.

    A pooled portfolio reports one residual per restart (``final_relative_stationarity_per_restart``):
    it fails when even its best restart stayed above the limit.
    """
    record = recon.record
    value, count = record.best_residual
    what = "its final relative residual" if record.portfolio is None else f"the best final relative residual of its {count} restarts"
    if value is None or value <= ATTACK_RESIDUAL_LIMIT:
        return []
    equation = "the stationarity equation" if record.equation.stationary else "the known-start equation"
    return [f"the attack did not find candidates that satisfy {equation} ({what} "
            f"{value:.3g} > {ATTACK_RESIDUAL_LIMIT:g}); a longer budget or other settings may"]


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
    wrong = int(np.sum(np.asarray(margins) <= 0))
    if weight_decay > 0 or wrong == 0:
        return []
    return [f"{wrong} of {len(margins)} training images are not fitted (margin <= 0): a model trained without weight decay "
            "reaches the max-margin point the attack assumes only after fitting all its training data, so it was trained too briefly"]


def scale_failure(recon, margins, weight_decay: float) -> list[str]:
    """Without weight decay the kkt attack assumes a margin (``formulation.NO_DECAY_MARGIN``); check it.

    Stationarity gives ``Σ_i λ_i·margin_i = ‖θ‖²/L``, so with the real training margins the typical
    multiplier is ``‖θ‖²/(L·Σ_i margin_i)``; outside ``NO_DECAY_SCALE_RANGE`` times it the attack
    was measured to find little (docs/defaults.md), so
    finding nothing says little. Checked only for the margin formulations, and not (no single
    ``S``) when pooled restarts used different scales.
    """
    cfg = recon.record.settings
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
            f"and {hi:g}× of it (docs/defaults.md), so finding nothing says little. An attacker can try several scales: "
            f"rerun with the attack parameter lambda_scale={typical / 2:.3g} (half the typical multiplier; "
            f"-p lambda_scale={typical / 2:.3g} on the command line)"]
