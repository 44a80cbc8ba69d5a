"""kkt's settings: its parameter table, the constants that are no longer settings, its presets, and the rules that
resolve ``"auto"``. Each default's evidence: docs/METHODS.md §5 and docs/defaults.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from exhume.attacks.engine.base import Param
from exhume.attacks.engine.loop import BACKGROUND, CANDIDATE_PARAMS, RETIRED_CANDIDATE_SETTINGS, budget_params
from exhume.equations.formulation import FORMULATIONS, MARGIN_FORMS
from exhume.equations.trajectory import EQUATIONS, PRECONDITIONERS, forgotten_start
from exhume.errors import ConfigError

#: lr_lambda="auto": the multipliers' learning rate for the margin formulations (binary, multiclass), where the
#: equation of a homogeneous network leaves their scale free and a fast rate lets it drift (docs/METHODS.md §5) ...
LR_LAMBDA_MARGIN = 1e-4
#: ... and for the signed ones ('output', 'loss'), whose multipliers must find their signs
LR_LAMBDA_SIGNED = 1e-2
#: a run long by its settings replays a traced step from its first step: a budget of at least TRACE_MIN_SECONDS, or
#: without a budget at least TRACE_MIN_ITERATIONS iterations (:func:`traces`). Tracing is paid once per process, which a
#: run of a few seconds (a tuning trial) would not win back; decided from the settings and the deadline's seconds as the
#: entry point gave them, never the clock, so a run at a fixed seed and iterations gives the same numbers on a fast or a
#: loaded machine (docs/defaults.md)
TRACE_MIN_SECONDS = 30.0
TRACE_MIN_ITERATIONS = 1000
#: iterations between two snapshot comparisons of the averaged iterate (:mod:`exhume.attacks.engine.snapshots`)
SNAPSHOT_EVERY = 500
#: how kkt's multipliers are found (the "multipliers" setting)
MULTIPLIER_MODES = ("learned", "closed-form")
#: start_equation="auto" with the starting weights known (exhume/equations/trajectory.py)
DEFAULT_START_EQUATION = "endpoints"
#: candidates per training point with a known start, unless candidates_per_point is given: at equal iterations
#: m = n memorised as much as m = 2n or more, in half the time (docs/defaults.md)
START_CANDIDATES_PER_POINT = 1.0

#: span_penalty="auto": the weight of the known-start span penalty where what training added one layer up shows the
#: span (docs/defaults.md#kkt-span_penalty: chosen on the ordinary-CNN zoo)
SPAN_PENALTY = 3.0

#: settings kkt no longer has, with the values under which a run did what it does now: a checkpoint that recorded
#: one of these resumes; another value is refused (:func:`exhume.attacks.engine.checkpoint.load_checkpoint`)
RETIRED: dict[str, tuple[Any, ...]] = {
    **RETIRED_CANDIDATE_SETTINGS, "lambda_scale_factor": (1.0,), "consistency_weight": (0.0,), "surrogate": ("fixed",),
    "sphere": ("off",), "lr_schedule": ("constant",), "mixed_derivative": ("double-backward", "jvp"), "keep": ("best",),
    "snapshot_every": (SNAPSHOT_EVERY,), "start_multipliers": ("auto",), "trace": ("auto", "off"),
}

PARAMS: dict[str, Param] = {
    "m": Param(None, int, "number of candidates (default: candidates_per_point × n, n the training-set size guess)",
               low=1, allow_none=True),
    "candidates_per_point": Param(2.0, float, "m = round(this × n) when m is not given (2: Haim et al.'s m = 2n; "
                                  f"with a known start, {START_CANDIDATES_PER_POINT:g} unless given)", low=1e-3),
    **CANDIDATE_PARAMS,
    # search ranges (exhume tune): log-uniform around the measured defaults
    "lr": replace(CANDIDATE_PARAMS["lr"], help="learning rate for x̂ (on the relative stationarity loss)", search=(2e-3, 5e-2, "log")),
    **budget_params(20_000),
    "lr_lambda": Param("auto", float, "learning rate for u (λ = S·u): a number, or 'auto': 1e-4 for the margin "
                       "formulations, 1e-2 for the signed ones ('output', 'loss'); the portfolio's other restarts use "
                       "1e-2 (docs/METHODS.md §5)", low=0.0, words=("auto",), search=(3e-5, 5e-2, "log")),
    "lambda_min": Param(0.42, float, "dual-feasibility floor on u = λ/S", low=0.0, search=(0.1, 1.5, "log")),
    "lambda_scale": Param("auto", float, "S in λ = S·u: 'auto' or a positive number", low=0.0, low_open=True, words=("auto",)),
    "formulation": Param("auto", str, "stationarity equation (see exhume/equations/formulation.py)", choices=FORMULATIONS),
    "alpha": Param(19.0, float, "ReLU surrogate derivative sigmoid(α·z)", low=0.0, search=(5.0, 60.0, "log")),
    "init_scale": Param(1.7e-3, float, "x̂ ~ N(0,1)·init_scale in centred space", low=0.0, search=(3e-4, 1e-2, "log")),
    "prior": Param("display", str, "pixel-range prior space", choices=("display", "centred")),
    "prior_weight": Param(1.0, float, "weight of the pixel-range prior", low=0.0),
    "tv_weight": Param(0.0, float, "weight of the total-variation (smoothness) prior on image candidates; "
                       "0 = off (MLPs), about 1e-4 for CNNs", low=0.0),
    "dual_weight": Param(5.0, float, "weight of the λ ≥ λ_min penalty", low=0.0),
    "average_decay": Param(0.99, float, "the returned iterate is an exponential moving average of the iterates with this "
                           f"decay (0 = the iterate itself), the snapshot (every {SNAPSHOT_EVERY} iterations) the attack's "
                           "own loss ranks lowest", low=0.0, high=0.99999),
    "subspace": Param("auto", str, "'auto': project the candidates onto the training inputs' span as the first "
                      "layer's weights show it (where they do; see exhume/attacks/kkt/subspace.py), or, where the input enters "
                      "through a convolution and a layer above shows the span, solve for that layer's input in its row "
                      "space and invert it to images (exhume/attacks/kkt/stage.py); 'off': neither",
                      choices=("off", "auto")),
    "denoise": Param("auto", str, "'auto': the stationarity equation explains each weight matrix's part above its "
                     "initialisation's noise where that noise still shows (see exhume/equations/span.py: learned_part); "
                     "'off': the weights as they are", choices=("off", "auto")),
    "background": BACKGROUND,
    "start_equation": Param("auto", str, "which equation the candidates solve: 'stationary' (a stationary point of training), "
                            "'trajectory' (what training added, on gradients at the final weights, multipliers without a "
                            "margin relation; weights only: the weights' learned part) or, with the starting weights known, "
                            "'endpoints' (on gradients at the start and the final weights); 'auto': "
                            f"{DEFAULT_START_EQUATION!r} when the view has a start, else 'stationary' (exhume/equations/trajectory.py)",
                            choices=("auto", "stationary", *EQUATIONS)),
    "multipliers": Param("learned", str, "'learned': λ = S·u optimised with the candidates (the papers' loss); "
                         "'closed-form': at every step λ minimises the equation's residual by least squares (signed, or "
                         "non-negative where the formulation's sign holds), the coefficient-free loss of "
                         "exhume/attacks/kkt/closed_form.py: no S, lr_lambda, lambda_min or dual term", choices=MULTIPLIER_MODES),
    "start_decay": Param("auto", float, "known start: c in θ_T − c·θ_0, the start's share left by weight decay: 'auto' "
                           "(from the training settings when they fix it, else fitted), 'fit', or a number in (0, 2]",
                           low=0.0, low_open=True, high=2.0, words=("auto", "fit")),
    "span_penalty": Param("auto", float, "known start, the input entering through no linear map: β × the candidates' mean "
                          "squared relative distance of their features to the row space of what training added to the first "
                          "linear layer above (W − c·W_0), added to the loss where that shows the span (exhume/equations/span.py: "
                          f"span_of); 'auto': {SPAN_PENALTY:g}, 0: off (exhume/attacks/kkt/stage.py)", low=0.0, words=("auto",)),
    "preconditioner": Param("auto", str, "known start: Adam's √v̂ + ε applied to what training added ('state': from the "
                            "second moment in the view's training settings; 'auto': 'state' when the view has it and at "
                            "least half the start survives in the weights)", choices=PRECONDITIONERS),
}

#: named settings (``preset=``, ``exhume attack --preset NAME``); settings given beside a preset win
PRESETS: dict[str, dict[str, Any]] = {
    # Haim et al.'s official extraction loop as exhume can express it (docs/METHODS.md §1, "The published settings"):
    # SGD with momentum 0.9 on x̂ and λ, lr 0.282 and 1e-4, init 1.74e-3, λ_min 0.415, α 19.2, the dual term ×5,
    # centred pixels in [−1, 1], m = 2n, the runner-up margin, float64, the last iterate; nothing the reference
    # lacks (no span projection, no denoising, no dark-background floor). exhume's loss stays relative to ‖θ‖² and its
    # multiplier scale S 'auto' stands for the reference's 1/m.
    "haim2022": {"optimizer": "sgd", "lr": 0.282, "lr_lambda": 1e-4, "init_scale": 1.74e-3, "lambda_min": 0.415,
                 "alpha": 19.2, "dual_weight": 5.0, "prior": "centred", "prior_weight": 1.0, "candidates_per_point": 2.0,
                 "formulation": "margin", "dtype": "float64", "average_decay": 0.0, "subspace": "off", "denoise": "off",
                 "background": 0.0},
}


def traces(iterations: int, seconds: float | None) -> bool:
    """Whether a run replays a traced step (from the first step): the run is long by its settings, ``seconds`` being
    its deadline's as the entry point gave them (:attr:`exhume.deadline.Deadline.seconds`; None: no deadline)."""
    if seconds:
        return seconds >= TRACE_MIN_SECONDS
    return iterations >= TRACE_MIN_ITERATIONS


def equation_for(value: str, view) -> str:
    """``start_equation`` as used on ``view``: 'auto' is the known-start default when the view has a start that training
    did not forget (:func:`~exhume.equations.trajectory.forgotten_start`), else 'stationary'."""
    if value == "auto":
        start = getattr(view, "start", None)
        return DEFAULT_START_EQUATION if start is not None and forgotten_start(view.model, start) is None else "stationary"
    if value == "endpoints" and getattr(view, "start", None) is None:
        raise ConfigError(f"start_equation {value!r} needs the starting weights (start=..., --start-weights FILE); "
                          "this view has none")
    return value


def candidate_count(m: int | None, candidates_per_point: float, n: int) -> int:
    """The number of candidates: ``m`` when given, else ``candidates_per_point × n`` (at least 1)."""
    return int(m) if m else max(1, round(float(candidates_per_point) * n))


def resolve_lr_lambda(value: Any, form: str) -> float:
    """``lr_lambda`` as a number: ``value`` itself, or for ``"auto"`` the rate for formulation ``form``."""
    if value != "auto":
        return float(value)
    return LR_LAMBDA_MARGIN if form in MARGIN_FORMS else LR_LAMBDA_SIGNED


def check(cfg: dict[str, Any], view) -> None:
    """Refuse (one line) settings this victim cannot take: an equation or a span penalty it lacks the start for, TV on
    non-images."""
    equation_for(cfg["start_equation"], view)
    if cfg["span_penalty"] not in ("auto", 0, 0.0) and getattr(view, "start", None) is None:
        raise ConfigError(f"span_penalty {cfg['span_penalty']!r} needs the starting weights (start=..., --start-weights FILE): "
                          "it reads what training added; this view has none (give 'auto' or 0)")
    if cfg["tv_weight"] > 0 and len(view.input_shape) != 3:
        raise ConfigError(f"tv_weight needs image inputs (C, H, W); this victim's input shape is {tuple(view.input_shape)}")
