"""The stationarity (KKT) attack of Haim et al. (2022), with Buzaglo et al.'s weight-decay form.

Unknowns: ``m`` candidates ``x̂_j`` (centred input space) with fixed labels ``ŷ_j`` and
multipliers ``λ_j = S · u_j``. Loss (docs/METHODS.md §1 and §5)::

    ‖θ − Σ_j λ_j ∇_θ h(Φ(θ; x̂_j), ŷ_j)‖² / ‖θ‖²               stationarity (relative)
    + dual_weight · Σ_j relu(λ_min − u_j)²                       dual feasibility, u ≥ λ_min
    + prior_weight · Σ relu(v − hi)² + relu(lo − v)²             pixels in the valid range
    + tv_weight · mean_j Σ (differences of neighbouring pixels of v_j)²   smoothness (images)

``h`` is the margin (binary ``y·Φ``; multiclass the soft margin ``Φ_y − log Σ_{k≠y} exp Φ_k`` by
default, or ``Φ_y − max_{k≠y} Φ_k``), ``−ℓ`` (the weight-decay form for any loss) or ``Φ``
(regression, signed λ, no dual term): see :mod:`exhume.attacks.formulation`. Binary candidates are
half +1 / half −1, multiclass ones spread evenly over the classes. ``v = x̂ + mean ∈ [0, 1]``
(``prior="display"``, the default) or ``v = x̂ ∈ [−1, 1]`` (``prior="centred"``, the reference's).
Every ReLU keeps its forward pass and uses ``sigmoid(α·z)`` as its derivative
(:mod:`exhume.attacks.surrogate`).

Defaults beyond the papers, each for a measured reason (docs/METHODS.md §5; the measurements in
``benchmarks/README.md`` under the titles named there): the multiplier scale ``S`` from the
weights (``lambda_scale="auto"``, :mod:`exhume.attacks.formulation`); ``lr_lambda="auto"`` (1e-4
for the margin forms, 1e-2 for the signed ones; the portfolio alternates them); Adam; the span
projection (``subspace="auto"``) and the hidden layers' noise left unexplained (``denoise="auto"``,
:mod:`exhume.attacks.subspace`); the best averaged iterate at constant rates
(:mod:`exhume.attacks.snapshots`); the dark-background floor on the returned candidates
(``background="auto"``, :func:`exhume.attacks.priors.dark_floor`). ``consistency_weight`` and
``tv_weight`` are off. ``run(..., fixed=(candidates, labels))`` is a deflation hook: fixed
candidates get least-squares multipliers and the free ones solve for the rest of ``θ``. With the
starting weights in the view, ``θ`` becomes what training added (§6, :mod:`exhume.attacks.trajectory`).
``multipliers="closed-form"``: λ solved by least squares every step (:mod:`exhume.attacks.closed_form`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from exhume.attacks.base import DTYPES, Attack, Param, Reconstruction, RestartPlan, attack_model, init_record, initial_candidates, register
from exhume.attacks.checkpoint import BUDGET_SETTINGS, resumable_settings
from exhume.attacks.closed_form import closed_form_residual, closed_form_setup, on_sphere, one_point
from exhume.attacks.equations import Equation, KnownStart, Stationarity
from exhume.attacks.formulation import FORMULATIONS, MARGIN_FORMS, Formulation, form_for, resolve
from exhume.attacks.loop import BACKGROUND, CANDIDATE_PARAMS, START_DECAY, attack_loop, budget_params, descend, make_optimizer, open_run
from exhume.attacks.priors import background_level, dark_floor, range_penalty, tv_term
from exhume.attacks.record import SolvedEquation
from exhume.attacks.snapshots import IterateTracker
from exhume.attacks.stationarity import (
    MIXED_DERIVATIVES,
    TracedResidual,
    fixed_part,
    residual_function,
    stationarity_residual_and_objective,
)
from exhume.attacks.subspace import Subspace, data_subspace, learned_part, remembered_input_layer
from exhume.attacks.surrogate import LayerScaled
from exhume.attacks.trajectory import (
    EQUATIONS,
    PRECONDITIONERS,
    StartEquation,
    added_inputs_layer,
    build_equation,
    forgotten_start,
    multiplier_scale,
    start_residual,
)
from exhume.errors import ConfigError, DivergenceError
from exhume.files.runfolder import tensors_digest
from exhume.losses import CLASSIFIER_LOSSES, LOSSES
from exhume.starts import start_digest

#: lr_lambda="auto": the multipliers' learning rate for the margin formulations (binary, multiclass), where the
#: equation of a homogeneous network leaves their scale free and a fast rate lets it drift (module docstring) ...
LR_LAMBDA_MARGIN = 1e-4
#: ... and for the signed ones ('output', 'loss'), whose multipliers must find their signs
LR_LAMBDA_SIGNED = 1e-2
#: trace='auto' replays a traced step from the first step of a run long by its settings: a budget of at least
#: TRACE_MIN_SECONDS, or without a budget at least TRACE_MIN_ITERATIONS iterations. Tracing is paid once per process,
#: which a run of a few seconds (a tuning trial) would not win back; decided from the settings, never the clock, so a
#: run at a fixed seed and iterations gives the same numbers on a fast or a loaded machine
#: (benchmarks/README.md#kkts-run-time-defaults)
TRACE_MIN_SECONDS = 30.0
TRACE_MIN_ITERATIONS = 1000


def traces(iterations: int, max_seconds: float | None) -> bool:
    """Whether ``trace="auto"`` replays a traced step (from the first step): the run is long by its settings."""
    if max_seconds:
        return max_seconds >= TRACE_MIN_SECONDS
    return iterations >= TRACE_MIN_ITERATIONS


#: how kkt's multipliers are found (the "multipliers" setting)
MULTIPLIER_MODES = ("learned", "closed-form")

#: how the ReLU surrogate's α is set (the "surrogate" setting; :func:`surrogate_alpha`)
SURROGATES = ("fixed", "layer-scaled")

#: start_equation="auto" with the starting weights known (exhume/attacks/trajectory.py)
DEFAULT_START_EQUATION = "endpoints"
#: candidates per training point with a known start, unless candidates_per_point is given: at equal iterations
#: m = n memorised as much as m = 2n or more, in half the time (benchmarks/README.md, "Known start")
START_CANDIDATES_PER_POINT = 1.0


def surrogate_alpha(cfg: dict[str, Any]) -> float | LayerScaled:
    """The ``alpha`` the surrogate derivative gets: the number, or with ``surrogate='layer-scaled'`` that number
    relative to each layer's scale (:class:`~exhume.attacks.surrogate.LayerScaled`)."""
    return LayerScaled(float(cfg["alpha"])) if cfg["surrogate"] == "layer-scaled" else cfg["alpha"]


def equation_for(value: str, view) -> str:
    """``start_equation`` as used on ``view``: 'auto' is the known-start default when the view has a start that training
    did not forget (:func:`~exhume.attacks.trajectory.forgotten_start`), else 'stationary'."""
    if value == "auto":
        start = getattr(view, "start", None)
        return DEFAULT_START_EQUATION if start is not None and forgotten_start(view.model, start) is None else "stationary"
    if value == "endpoints" and getattr(view, "start", None) is None:
        raise ConfigError(f"start_equation {value!r} needs the starting weights (start=..., --start-weights FILE); "
                          "this view has none")
    return value


def frozen_layer_reason(layer: str) -> str:
    """Why a known start's frozen input layer gives no span."""
    return f"{layer} is frozen at its start: its weights show the data it was trained on before, not this training set"


def candidate_count(m: int | None, candidates_per_point: float, n: int) -> int:
    """The number of candidates: ``m`` when given, else ``candidates_per_point × n`` (at least 1)."""
    return int(m) if m else max(1, round(float(candidates_per_point) * n))


def resolve_lr_lambda(value: Any, form: str) -> float:
    """``lr_lambda`` as a number: ``value`` itself, or for ``"auto"`` the rate for formulation ``form``."""
    if value != "auto":
        return float(value)
    return LR_LAMBDA_MARGIN if form in MARGIN_FORMS else LR_LAMBDA_SIGNED


@dataclass
class Problem:
    """The attack's working copy of the victim and its unknowns (centred candidates ``x``, ``u``)."""

    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    norm2: torch.Tensor  # ‖θ‖², or ‖θ − Σ_f λ_f ∇_θ h_f‖² with candidates held fixed
    n: int
    m: int
    form: Formulation
    mean: torch.Tensor
    y: torch.Tensor
    x: torch.Tensor
    u: torch.Tensor
    target: dict[str, torch.Tensor] | None = None
    fixed_info: dict[str, Any] | None = None
    span: Subspace = field(default_factory=lambda: Subspace(None))
    lr_lambda: float = LR_LAMBDA_MARGIN  # u's learning rate, 'auto' resolved for the formulation
    eq: StartEquation | None = None  # the known-start equation (exhume.attacks.trajectory), or the stationary one
    closed: bool = False  # multipliers solved in closed form every step (exhume.attacks.closed_form), u not learned
    radius: float | None = None  # candidates kept at this norm (centred), or None


def consistency_term(lam: torch.Tensor, margins: torch.Tensor, n_w: float) -> torch.Tensor:
    """``mean_j (log(λ_j·n·w) + softplus(margin_j))²``: zero where ``λ_j = σ(−margin_j)/(n·w)``.

    At a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` with the logistic loss every training point
    has exactly this multiplier (for cross-entropy too with the soft margin; approximately with the
    margin against the runner-up class). ``λ ≤ 0`` is clamped to 1e-30 (no gradient there).
    """
    return ((torch.log((lam * n_w).clamp_min(1e-30)) + torch.nn.functional.softplus(margins)) ** 2).mean()


def check_fixed(fixed, input_shape, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fixed = (candidates, labels)`` in display space, validated: one clear error per defect."""
    if not (isinstance(fixed, (tuple, list)) and len(fixed) == 2 and all(isinstance(t, torch.Tensor) for t in fixed)):
        raise ConfigError("fixed must be a pair of tensors (candidates in display space, their labels)")
    fx, fy = fixed
    if fx.ndim != 1 + len(input_shape) or tuple(fx.shape[1:]) != tuple(input_shape) or fx.shape[0] < 1:
        raise ConfigError(f"fixed candidates must have shape (k >= 1, {', '.join(map(str, input_shape))}), got {tuple(fx.shape)}")
    if tuple(fy.shape) != (fx.shape[0], *labels.shape[1:]):
        raise ConfigError(f"fixed labels must have shape {(fx.shape[0], *labels.shape[1:])}, got {tuple(fy.shape)}")
    if not (torch.isfinite(fx).all() and torch.isfinite(fy.double()).all()):
        raise ConfigError("fixed candidates and labels must be finite (found NaN or inf)")
    return fx, fy


def check_consistency(form: Formulation, view, eq) -> None:
    """``consistency_weight > 0`` needs a classifier's margin form at a stationary point with weight decay (one error per reason)."""
    if eq is not None:
        raise ConfigError("consistency_weight ties multipliers to margins at a stationary point; the known-start equation has "
                          "no such relation: leave consistency_weight at 0 or pass start_equation='stationary'")
    if form.name not in MARGIN_FORMS or view.task not in ("binary", "multiclass"):
        raise ConfigError(f"consistency_weight needs the margin formulation of a classifier; this run uses "
                          f"formulation {form.name!r} on a {view.task} victim")
    if form.info["weight_decay_assumed"] <= 0:
        raise ConfigError("consistency_weight needs the victim's weight decay w > 0 (λ_i = σ(−margin_i)/(n·w) holds "
                          "only with weight decay); pass weight_decay= if the metadata lacks it, or leave "
                          "consistency_weight at 0")
    if form.info["loss_assumed"] not in CLASSIFIER_LOSSES:
        raise ConfigError(f"consistency_weight needs a victim trained with the logistic or cross-entropy loss "
                          f"(λ_i = σ(−margin_i)/(n·w)); this victim's loss is {form.info['loss_assumed']!r} "
                          f"(pass loss= if the metadata lacks it)")


@register
class KKTAttack(Attack):
    """Stationarity (KKT) reconstruction from the weights alone: binary, multiclass, regression."""

    name = "kkt"
    equation = Stationarity(multiplier_scale=True)  # S is set from the weights alone: checked against the real margins
    # restarts alternate lr_lambda 1e-4 ('auto' for classifiers; 1e-2 for regression) and 1e-2: the equation leaves the
    # multipliers' scale free; learned fast it drifts on some victims and must move on others, so the alternation hedges
    # (variants of the λ scale and of α did not pay): benchmarks/README.md, "How fast the multipliers learn: a
    # portfolio variant" and "The multipliers' learning rate of a lone run"
    restart_plan = RestartPlan(variants=({}, {"lr_lambda": 1e-2}))
    multipliers = True
    uses_start = True  # a start in the view switches the equation (start_equation="auto")
    batchable = True  # exhume/portfolio/batched.py stacks its restarts
    params = {
        "m": Param(None, int, "number of candidates (default: candidates_per_point × n, n the training-set size guess)",
                   low=1, allow_none=True),
        "candidates_per_point": Param(2.0, float, "m = round(this × n) when m is not given (2: Haim et al.'s m = 2n; "
                                      f"with a known start, {START_CANDIDATES_PER_POINT:g} unless given)", low=1e-3),
        **CANDIDATE_PARAMS,
        # search ranges (exhume tune): log-uniform around the measured defaults
        "lr": replace(CANDIDATE_PARAMS["lr"], help="learning rate for x̂ (on the relative stationarity loss)", search=(2e-3, 5e-2, "log")),
        **budget_params(20_000, checkpoint_every=1000, log_every=100),
        "lr_lambda": Param("auto", float, "learning rate for u (λ = S·u): a number, or 'auto': 1e-4 for the margin "
                           "formulations, 1e-2 for the signed ones ('output', 'loss'); the portfolio's other restarts use "
                           "1e-2 (see the module docstring)", low=0.0, words=("auto",), search=(3e-5, 5e-2, "log")),
        "lambda_min": Param(0.42, float, "dual-feasibility floor on u = λ/S", low=0.0, search=(0.1, 1.5, "log")),
        "lambda_scale": Param("auto", float, "S in λ = S·u: 'auto' or a positive number", low=0.0, low_open=True, words=("auto",)),
        "lambda_scale_factor": Param(1.0, float, "multiplies S (the 'auto' estimate or the given number); "
                                     "a portfolio variant", low=1e-6),
        "formulation": Param("auto", str, "stationarity equation (see exhume/attacks/formulation.py)", choices=FORMULATIONS),
        "loss": Param(None, str, "the victim's training loss, if its metadata lacks it", choices=LOSSES, allow_none=True),
        "alpha": Param(19.0, float, "ReLU surrogate derivative sigmoid(α·z)", low=0.0, search=(5.0, 60.0, "log")),
        "surrogate": Param("fixed", str, "how α is set: 'fixed', one number for every ReLU; 'layer-scaled', α = alpha / "
                           "median|z| of each candidate's own pre-activations at each ReLU (recomputed every step, held fixed in "
                           "derivatives; exhume/attacks/surrogate.py: layer_alpha)", choices=SURROGATES),
        "init_scale": Param(1.7e-3, float, "x̂ ~ N(0,1)·init_scale in centred space", low=0.0, search=(3e-4, 1e-2, "log")),
        "prior": Param("display", str, "pixel-range prior space", choices=("display", "centred")),
        "prior_weight": Param(1.0, float, "weight of the pixel-range prior", low=0.0),
        "tv_weight": Param(0.0, float, "weight of the total-variation (smoothness) prior on image candidates; "
                           "0 = off (MLPs), about 1e-4 for CNNs", low=0.0),
        "dual_weight": Param(5.0, float, "weight of the λ ≥ λ_min penalty", low=0.0),
        "consistency_weight": Param(0.0, float, "weight of the multiplier-margin consistency term "
                                    "mean_j (log(λ_j·n·w) + softplus(margin_j))² (margin form with weight decay w; "
                                    "see the module docstring)", low=0.0),
        "average_decay": Param(0.99, float, "the returned iterate is an exponential moving average of the iterates "
                               "with this decay (0 = the last iterate)", low=0.0, high=0.99999),
        "keep": Param("best", str, "which averaged iterate to return: the snapshot the attack's own loss ranks "
                      "lowest ('best') or the final one ('last')", choices=("best", "last")),
        "snapshot_every": Param(500, int, "iterations between snapshot comparisons", low=1),
        "subspace": Param("auto", str, "'auto': project the candidates onto the training inputs' span as the first "
                          "layer's weights show it (where they do; see exhume/attacks/subspace.py); 'off': do not",
                          choices=("off", "auto")),
        "denoise": Param("auto", str, "'auto': the stationarity equation explains each weight matrix's part above its "
                         "initialisation's noise where that noise still shows (see exhume/attacks/subspace.py: learned_part); "
                         "'off': the weights as they are", choices=("off", "auto")),
        "background": BACKGROUND,
        "start_equation": Param("auto", str, "which equation the candidates solve: 'stationary' (a stationary point of training), "
                          "'trajectory' (what training added, on gradients at the final weights, multipliers without a margin "
                          "relation; weights only: the weights' learned part) or, with the starting weights known, 'endpoints' "
                          "(on gradients at the start and the final weights); 'auto': "
                          f"{DEFAULT_START_EQUATION!r} when the view has a start, else 'stationary' (exhume/attacks/trajectory.py)",
                          choices=("auto", "stationary", *EQUATIONS)),
        "multipliers": Param("learned", str, "'learned': λ = S·u optimised with the candidates (the papers' loss); "
                             "'closed-form': at every step λ minimises the equation's residual by least squares (signed, or "
                             "non-negative where the formulation's sign holds), the coefficient-free loss of "
                             "exhume/attacks/closed_form.py: no S, lr_lambda, lambda_min or dual term",
                             choices=MULTIPLIER_MODES),
        "sphere": Param("off", str, "keep each centred candidate at the norm a data-like input has (√Σμ(1−μ), μ the data mean): "
                        "'auto' with closed-form multipliers where the model is positively homogeneous in its input and h "
                        "is its margin or output (the equation then fixes a training point only up to a positive scale); "
                        "'on'; 'off' (the default: that radius overestimates grey images' norm and the pixel-range prior "
                        "then fights it; the prior alone sets the scale, benchmarks/README.md, 'Random features in the "
                        "law's regime')", choices=("auto", "on", "off")),
        "start_decay": START_DECAY,
        "start_multipliers": Param("auto", str, "known start: the multipliers' sign; 'auto': non-negative with a classifier's "
                                   "margin or loss (a training point's gradient enters with the sign its label gives), signed with "
                                   "'output'", choices=("auto", "nonnegative", "signed")),
        "preconditioner": Param("auto", str, "known start: Adam's √v̂ + ε applied to what training added ('state': from the "
                                "second moment in the view's training settings; 'auto': 'state' when the view has it and at "
                                "least half the start survives in the weights)", choices=PRECONDITIONERS),
        "lr_schedule": Param("constant", str, "learning-rate schedule over the budget (iterations or max_seconds, "
                             "whichever ends first)", choices=("constant", "cosine")),
        "mixed_derivative": Param("double-backward", str, "how the stationarity term is differentiated in x̂ and λ: "
                                  "through its gradient's graph ('double-backward') or as a jvp in θ along the residual "
                                  "then one reverse pass ('jvp'); equal results, the default measured faster "
                                  "(see exhume/attacks/stationarity.py)", choices=MIXED_DERIVATIVES),
        "trace": Param("auto", str, f"'auto': in a run of a budget of at least {TRACE_MIN_SECONDS:g} s (or without one, of at least "
                       f"{TRACE_MIN_ITERATIONS} iterations), the stationarity term's value and gradients are traced once into a "
                       "graph of tensor operations that every step replays (the same numbers, less time; "
                       "exhume/attacks/stationarity.py: TracedResidual), except with mixed_derivative='jvp', the "
                       "consistency term, or a module that cannot be traced; 'off': eager every step", choices=("auto", "off")),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.given = frozenset(kwargs)  # the settings the caller chose (the known start has defaults of its own)

    def equation_used(self, view) -> str:
        """The equation a run on ``view`` solves: 'stationary', or with a start 'trajectory' / 'endpoints'
        (:mod:`exhume.attacks.trajectory`, whose :func:`~exhume.attacks.trajectory.known_start_residual` is its check)."""
        return equation_for(self.config["start_equation"], view)

    def equation_on(self, view) -> Equation:
        """Stationarity, or with ``start_equation`` other than 'stationary' the known-start equation (its check)."""
        used = self.equation_used(view)
        if used == "stationary":
            return self.equation
        return KnownStart(view=view if getattr(view, "start", None) is not None else None, kind=used,
                          decay=self.config["start_decay"], preconditioner=self.config["preconditioner"],
                          formulation=self.config["formulation"], nonnegative=self.config["start_multipliers"] != "signed")

    memory_knobs = {"m": "count", "dtype": "dtype"}

    def effective(self, view, name: str) -> Any:
        if name == "m":
            return candidate_count(self.config["m"], self.config["candidates_per_point"], self.config["n_guess"] or view.n_train_hint or 100)
        return super().effective(view, name)

    def peak_memory_bytes(self, view) -> int:
        """Peak bytes from the victim's parameters ``P``, input size ``D``, activations per input ``A``, the candidates ``m`` and
        the dtype's bytes ``b``: the larger of the set-up (SVDs of the weights in float64: ``5.2·8P + 1.4·m·D·b``) and the
        steps (``6.8·P·b + 14.9·m·D·b + 5.2·m·A·b``), coefficients measured (``benchmarks/memory_estimate.py``)."""
        from exhume.attacks import memory as mem

        b, m = mem.dtype_bytes(self.config["dtype"]), self.effective(view, "m")
        p, d = mem.parameter_count(view.model), mem.input_elements(view)
        a = mem.activation_elements(view.model, tuple(view.input_shape))
        svd = self.config["subspace"] != "off" or self.config["denoise"] != "off"
        setup = (5.2 * 8 * p if svd else 2 * p * b) + 1.4 * m * d * b
        steps = 6.8 * p * b + 14.9 * m * d * b + 5.2 * b * (m * a.per_input + a.fixed)
        if self.config["multipliers"] == "closed-form":  # Φ at up to two points, and its float64 copy: counted, not measured
            steps += 2 * m * p * (b + 8)
        return int(mem.BASE_BYTES + max(setup, steps))

    def candidate_count(self, n: int) -> int:
        return candidate_count(self.config["m"], self.config["candidates_per_point"], int(self.config["n_guess"] or n))

    def search_start(self, view) -> dict[str, float]:
        """The defaults, with ``lr_lambda="auto"`` as it resolves for the formulation this run uses on ``view``."""
        form = form_for(view, self.config["formulation"], self.config["loss"])
        return {**super().search_start(view), "lr_lambda": resolve_lr_lambda(self.config["lr_lambda"], form)}

    def check(self, view) -> None:
        equation_for(self.config["start_equation"], view)
        if self.config["tv_weight"] > 0 and len(view.input_shape) != 3:
            raise ConfigError(f"tv_weight needs image inputs (C, H, W); this victim's input shape is {tuple(view.input_shape)}")

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 1000, init: torch.Tensor | None = None,
            init_name: str = "noise", callback_multipliers: bool = False,
            fixed: tuple[torch.Tensor, torch.Tensor] | None = None) -> Reconstruction:
        """Run the attack on ``view`` (an :class:`~exhume.victim.AttackerView`).

        ``out``: folder for checkpoints (every ``checkpoint_every`` iterations and at the end);
        ``resume``: continue from its checkpoint. ``callback(iteration, seconds, candidates)`` is
        called every ``callback_every`` iterations with the display-space candidates (for
        quality-over-time curves; its time is not counted in ``seconds``). ``init``: starting
        candidates in display space (default: noise); ``init_name`` labels them in the result
        (ground-truth, partition and mix initialisations are oracle tools and marked so).
        ``callback_multipliers=True`` also passes the current multipliers ``λ = S·u`` and the labels as the
        keywords ``multipliers`` and ``labels`` (for attacker-side scoring during a hyperparameter search).
        ``fixed=(candidates, labels)`` (display space) holds those candidates fixed: their multipliers
        are fitted once by least squares on ``θ`` (non-negative unless the formulation is signed) and
        the free candidates solve for what they leave, ``θ − Σ_f λ_f ∇_θ h_f``, the relative
        stationarity taken against its norm (deflation; see the module docstring).
        """
        self.check(view)
        cfg = self.config
        p = self.problem(view, torch.device(device), seed, init, fixed)
        opts, tracker, run = self.open_state(view, p, out, resume, seed)
        step = self.stepper(p, opts, run.history, tracker)

        tau, why = background_level(cfg["background"], view.mean, tuple(view.input_shape))

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                extra = {"multipliers": (p.form.scale * p.u).float().cpu(), "labels": p.y.cpu()} if callback_multipliers else {}
                callback(it, elapsed, dark_floor((p.x + p.mean).float(), tau).cpu(), **extra)

        end = attack_loop("kkt attack", cfg, run, step, progress=progress, emit=None if callback is None else emit,
                          emit_every=callback_every)
        if tracker.best_iteration != end.done:
            tracker.consider(end.done, self.criterion(p))
        return self.result(p, end, run, tracker, (tau, why), seed, init_name, view)

    def open_state(self, view, p: Problem, out, resume: bool, seed: int):
        """``((opt_x, opt_u), tracker, run)`` of a run on ``p``: its optimisers, averaged iterates and checkpoint
        (restored in place on ``resume``); shared with the batched restarts (:mod:`exhume.portfolio.batched`)."""
        cfg = self.config
        opt_x = make_optimizer(cfg["optimizer"], [p.x], cfg["lr"], cfg["momentum"])
        opt_u = make_optimizer(cfg["optimizer"], [p.u], p.lr_lambda, cfg["momentum"])
        tracker = IterateTracker({"x": p.x, "u": p.u}, cfg["average_decay"], cfg["snapshot_every"], cfg["keep"])
        run = open_run(out, resume, {"x": p.x, "u": p.u, **tracker.state()}, {"opt_x": opt_x, "opt_u": opt_u},
                       {"config": resumable_settings(cfg, BUDGET_SETTINGS + ("background",)), "seed": seed, "m": p.m,
                        **({"fixed": p.fixed_info["fixed_digest"]} if p.fixed_info else {}),
                        "start": start_digest(view.start)}, defaults=self.defaults())
        return (opt_x, opt_u), tracker, run

    def result(self, p: Problem, end, run, tracker: IterateTracker, background: tuple[float, str], seed: int,
               init_name: str, view) -> Reconstruction:
        """The kept iterate as a Reconstruction: display-space candidates, their multipliers, settings and summary."""
        cfg = self.config
        tau, why = background
        kept_x, kept_u = tracker.best["x"], tracker.best["u"]
        if p.closed:
            kept_u = kept_u.clone()
            with torch.no_grad():
                self.terms(p, kept_x, kept_u)  # the closed-form multipliers of the kept candidates
        with torch.no_grad():
            final_stat = float(self.residual(p, kept_x, kept_u, None)[0] / p.norm2)
            candidates = dark_floor((kept_x + p.mean).float(), tau).cpu()
        lam = (p.form.scale * kept_u).detach().float().cpu()
        return Reconstruction(
            method=self.name,
            candidates=candidates,
            labels=p.y.cpu(),
            scores=lam if lam.dim() == 1 else lam[:, -1],
            config={**cfg, "m": p.m, "n_guess": p.n, "lambda_scale_value": p.form.scale, "lr_lambda_used": p.lr_lambda, **p.form.info,
                    **init_record(init_name), **(p.fixed_info or {}), **p.span.info, **self.threat(p, view),
                    "background_used": tau, "background_reason": why},
            seed=seed,
            loss_history=run.history,
            summary={"iterations": end.done, "seconds": round(end.elapsed, 3), "final_relative_stationarity": final_stat,
                     "final_relative_stationarity_note": "with the exact ReLU derivative, of the returned iterate"
                     + ("; of the known-start equation (what training added)" if p.eq is not None else ""),
                     "threat_model": view.threat_model,
                     "kept_iteration": tracker.best_iteration, "kept_criterion": tracker.best_score,
                     "kept_iterate": (f"exponential moving average (decay {cfg['average_decay']:g})" if cfg["average_decay"] > 0
                                      else "iterate") + f", {cfg['keep']} snapshot every {cfg['snapshot_every']} iterations"},
        )

    @staticmethod
    def threat(p: Problem, view) -> dict[str, Any]:
        """What the attacker knew and which equation it solved (recorded in the config)."""
        rec: dict[str, Any] = {"threat_model": view.threat_model, "equation_used": SolvedEquation.STATIONARY.value if p.eq is None else p.eq.info["equation"]}
        if p.eq is not None:
            rec.update({f"start_{k}" if not k.startswith("start_") else k: v for k, v in p.eq.info.items() if k != "equation"})
            rec["start_digest"] = start_digest(view.start)
            rec["training_settings"] = None if view.training is None else view.training.record()
        elif getattr(view, "start", None) is not None:
            rec["start_unused"] = forgotten_start(view.model, view.start) or "the stationary equation (start_equation='stationary' was given)"
        return rec

    def residual(self, p: Problem, x: torch.Tensor, u: torch.Tensor, alpha: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(‖what the equation leaves‖², h)`` at candidates ``x`` and multipliers ``λ = S·u`` (not yet relative)."""
        if p.eq is not None:
            return start_residual(p.model, p.eq, x, p.y, p.form.scale * u, alpha, p.form.objective)
        return stationarity_residual_and_objective(p.model, p.params, x, p.y, p.form.scale * u, alpha, p.form.objective, p.target)

    def problem(self, view, dev: torch.device, seed: int, init: torch.Tensor | None,
                fixed: tuple[torch.Tensor, torch.Tensor] | None = None) -> Problem:
        """The working copy of the victim (the user's module stays as it is), the equation, and the starting unknowns."""
        cfg = self.config
        dtype = DTYPES[cfg["dtype"]]
        model, params = attack_model(view.model, dev, dtype)
        n = cfg["n_guess"] or view.n_train_hint or 100
        equation = equation_for(cfg["start_equation"], view)
        per_point = cfg["candidates_per_point"]
        if equation != "stationary" and view.start is not None and "candidates_per_point" not in self.given:
            per_point = START_CANDIDATES_PER_POINT
        m = cfg["m"] or (init.shape[0] if init is not None else candidate_count(None, per_point, n))
        # with a known start only the parameters whose start is unknown need their learned part (their weights' SVDs)
        pool = params if equation == "stationary" or view.start is None else {k: v for k, v in params.items() if k not in view.start}
        target, denoised = learned_part(pool, n) if cfg["denoise"] != "off" and pool else (None, {})
        eq = None
        if equation == "stationary":
            form = resolve(view, model, cfg["formulation"], cfg["loss"], cfg["weight_decay"], cfg["lambda_scale"], params, n, m, dtype)
            form.info.update(denoised)
        else:
            eq, form = self.start_equation(view, model, params, equation, n, m, dtype, target)
            # the same span at half the cost where the trained parameters enter linearly (learned or solved multipliers)
            eq = one_point(model, eq, view.mean.to(dev, dtype), form.labels, form.objective)
        form.scale *= cfg["lambda_scale_factor"]
        if cfg["consistency_weight"] > 0:
            check_consistency(form, view, eq)
        x, u = self.unknowns(view, m, form.signed, eq, seed, init, dev)
        mean = view.mean.to(dev, dtype)
        info = None
        if fixed is not None:
            if eq is not None:
                raise ConfigError("fixed candidates (deflation) work with the stationary equation only; pass start_equation='stationary'")
            fx, fy = check_fixed(fixed, view.input_shape, form.labels)
            target, _, share = fixed_part(model, params, fx.to(dev, dtype) - mean, fy.to(dev, form.labels.dtype),
                                          form.objective, form.signed, theta=target)
            info = {"fixed_candidates": int(fx.shape[0]), "fixed_share_explained": share, "fixed_digest": tensors_digest(fx, fy)[:16]}
        span = self.span(view, model, params, n, eq, x)
        closed, radius = closed_form_setup(cfg, view, model, params, form, x, u)
        # the stationarity term is relative to what the free candidates must explain
        norm2 = eq.norm2 if eq is not None else sum((v**2).sum() for v in (params if target is None else target).values())
        lr_lambda = resolve_lr_lambda(cfg["lr_lambda"], form.name if eq is None else "output")
        return Problem(model, params, norm2, n, m, form, mean, form.labels.to(dev), x, u, target if eq is None else None, info,
                       span, lr_lambda, eq, closed, radius)

    def unknowns(self, view, m: int, signed: bool, eq: StartEquation | None, seed: int, init: torch.Tensor | None,
                 dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The starting candidates ``x`` (not yet projected onto the span) and multipliers ``u`` drawn from ``seed``."""
        dtype = DTYPES[self.config["dtype"]]
        gen = torch.Generator().manual_seed(seed)
        x = initial_candidates(init, m, view.input_shape, view.mean, self.config["init_scale"], gen, dtype).to(dev).requires_grad_()
        shape = (m,) if eq is None else (m, eq.multipliers)
        u = (torch.randn if signed else torch.rand)(shape, generator=gen, dtype=dtype).to(dev).requires_grad_()
        return x, u

    def start_equation(self, view, model, params, equation: str, n: int, m: int, dtype, learned) -> tuple[StartEquation, Formulation]:
        """The known-start equation and its formulation: the victim's ``h``, signed multipliers, the probe scale."""
        cfg = self.config
        form = resolve(view, model, cfg["formulation"], cfg["loss"], cfg["weight_decay"], 1.0, params, n, m, dtype)
        eq = build_equation(view, model, params, equation, n, cfg["start_decay"], cfg["preconditioner"], unknown=learned)
        if cfg["lambda_scale"] == "auto":
            scale, rule = multiplier_scale(model, eq, view.mean.to(next(iter(params.values())).device, dtype), form.labels,
                                           form.objective, n)
        else:
            scale, rule = float(cfg["lambda_scale"]), {"lambda_scale_rule": "given"}
        sign = cfg["start_multipliers"]
        form.signed = sign == "signed" or (sign == "auto" and form.name == "output")
        form.scale = scale
        form.info.update(rule, multipliers=f"{'signed' if form.signed else 'non-negative'}, "
                         f"{'one per candidate' if eq.shared else 'one per candidate and gradient point'}")
        return eq, form

    def span(self, view, model, params, n: int, eq: StartEquation | None, x: torch.Tensor) -> Subspace:
        """The training inputs' span (:mod:`exhume.attacks.subspace`), the candidates projected onto it; with a known
        start read from what training added to the input layer."""
        if self.config["subspace"] == "off":
            return Subspace(None)
        trained_in = next((w.dtype for w in view.model.parameters()), None)  # the precision floor is the victim's, not the attack's
        extra: dict[str, Any] = {}
        if eq is not None and view.start is not None:
            layer = remembered_input_layer(view.model, model, params, tuple(view.input_shape))
            if layer is not None and layer not in eq.names:  # frozen: no SVD of it is needed to know it shows no span
                return Subspace(None, {"subspace_used": "none", "subspace_layer": layer, "subspace_reason": frozen_layer_reason(layer)})
            start = {k: v.to(params[k]) for k, v in view.start.items()}
            params, extra = added_inputs_layer(eq, params, start, math.prod(view.input_shape))
        span = data_subspace(model, params, tuple(view.input_shape), n, precision=trained_in)
        layer = span.info.get("subspace_layer")
        if span.basis is not None and eq is not None and view.start is not None and layer not in eq.names:
            span = Subspace(None, {"subspace_used": "none", "subspace_layer": layer, "subspace_reason": frozen_layer_reason(layer)})
        span.info.update(extra)
        with torch.no_grad():
            x.copy_(span.project(x))
        return span

    def terms(self, p: Problem, x: torch.Tensor, u: torch.Tensor, residual=None):  # noqa: ANN001
        """The loss of the module docstring at ``(x, u)`` and its stationarity, dual and prior terms
        (``residual``: the stationarity function to use, default the ``mixed_derivative`` one)."""
        cfg = self.config
        lo, hi, shift = (0.0, 1.0, p.mean) if cfg["prior"] == "display" else (-1.0, 1.0, torch.zeros_like(p.mean))
        # the per-candidate margins h come from the residual's own forward pass (used by the consistency term)
        if p.closed:  # the multipliers solved in closed form (u overwritten with them); h is not needed
            stat, lam = closed_form_residual(p.model, x, p.y, p.form.objective, surrogate_alpha(cfg), not p.form.signed, p.eq, p.params, p.target)
            with torch.no_grad():
                u.copy_(lam / p.form.scale)
        elif p.eq is not None:  # the known-start equation: eager (its traced replay is not built)
            stat, h = self.residual(p, x, u, surrogate_alpha(cfg))
        else:
            residual = residual or residual_function(cfg["mixed_derivative"])
            stat, h = residual(p.model, p.params, x, p.y, p.form.scale * u, surrogate_alpha(cfg), p.form.objective, p.target)
        stat = stat / p.norm2
        floor = cfg["lambda_min"] if p.eq is None else 0.0  # the known-start equation has no margin: λ ≥ 0 only
        dual = u.new_zeros(()) if p.form.signed or p.closed else (torch.relu(floor - u) ** 2).sum()
        v = x + shift
        prior = range_penalty(v, lo, hi)
        loss = stat + cfg["dual_weight"] * dual + cfg["prior_weight"] * prior
        if cfg["tv_weight"] > 0:
            loss = loss + cfg["tv_weight"] * tv_term(v)
        if cfg["consistency_weight"] > 0:
            loss = loss + cfg["consistency_weight"] * consistency_term(p.form.scale * u, h, p.n * p.form.info["weight_decay_assumed"])
        return loss, stat, dual, prior

    def criterion(self, p: Problem):
        """The attacker-side criterion of a snapshot: the attack's own loss (lower is better)."""

        def score(t: dict[str, torch.Tensor]) -> float:
            with torch.no_grad():
                return float(self.terms(p, t["x"], t["u"].clone() if p.closed else t["u"])[0])

        return score

    def step_residual(self, p: Problem) -> TracedResidual | None:
        """The traced stationarity function the steps use (None: the eager one); the choice goes to the result's config."""
        cfg = self.config
        why = ("'trace' is 'off'" if cfg["trace"] == "off" else "the known-start equation" if p.eq is not None
               else "mixed_derivative 'jvp'" if cfg["mixed_derivative"] == "jvp"
               else "the consistency term differentiates the margins" if cfg["consistency_weight"] > 0 else None)
        if why is None and not traces(cfg["iterations"], cfg["max_seconds"]):
            why = (f"a budget under {TRACE_MIN_SECONDS:g} s" if cfg["max_seconds"]
                   else f"fewer than {TRACE_MIN_ITERATIONS} iterations") + " (trace='auto' would not win back the tracing)"
        if why is None:
            return TracedResidual(p.form.info)
        p.form.info.update(residual_traced=False, residual_trace_note=f"eager: {why}")
        return None

    def stepper(self, p: Problem, opts: tuple[torch.optim.Optimizer, ...], history: list[dict[str, float]],
                tracker: IterateTracker):
        """One optimisation step on the loss of the module docstring (appends to ``history`` when logging)."""
        cfg = self.config
        score = self.criterion(p)
        residual = self.step_residual(p)

        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            if cfg["lr_schedule"] == "cosine":
                frac = max(it / cfg["iterations"], clock() / cfg["max_seconds"] if cfg["max_seconds"] else 0.0)
                for opt, base in zip(opts, (cfg["lr"], p.lr_lambda)):
                    opt.param_groups[0]["lr"] = base * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))
            loss, stat, dual, prior = self.terms(p, p.x, p.u, residual)
            if not torch.isfinite(loss):
                raise DivergenceError(f"kkt attack diverged at iteration {it} (loss {float(loss.detach())}); lower lr (now {cfg['lr']})")
            descend(loss, opts[:1] if p.closed else opts, p.span, p.x)
            if p.radius is not None:
                on_sphere(p.x, p.radius)
            tracker.update({"x": p.x, "u": p.u})
            if it % cfg["snapshot_every"] == 0:
                tracker.consider(it, score)
            if not log:
                return None
            rec = {"iteration": it, "loss": float(loss.detach()), "stationarity": float(stat.detach()),
                   "dual": float(dual.detach()), "prior": float(prior.detach()), "seconds": round(clock(), 3)}
            history.append(rec)
            return {"stat": f"{rec['stationarity']:.3g}"}

        return step
