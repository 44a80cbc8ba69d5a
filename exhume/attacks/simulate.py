"""Simulated training from the known start, differentiated through (the idea of SimuDy, Tian et al., ICLR 2025).

With the start ``θ_0`` known, train a copy of the victim from ``θ_0`` for ``S`` full-batch
gradient steps on ``m`` candidates with learnable soft labels and learnable step sizes, and move
the candidates so that the simulated change points where training went::

    θ^(s+1) = θ^(s) − η_s ∇_θ mean_j ℓ(Φ(θ^(s); x̂_j), q_j),    η_s = η·exp(ρ_s),   s < S
    loss = 1 − cos(P⊥ (θ_T − c·θ_0),  P⊥ (θ^(S) − θ_0))  + prior_weight · range + tv_weight · TV

``q_j``: a soft label (binary: ``σ(l_j)`` the probability of +1; multiclass: ``softmax(l_j)``),
initialised at the candidate's fixed class. The cosine makes the overall step size irrelevant
(``η`` only sets how far the simulation moves, hence how nonlinear it is); ``P⊥`` projects off the
start where its decay ``c`` is fitted, as in :mod:`exhume.attacks.trajectory` (whose target,
preconditioner and frozen parameters this attack shares). Every trained parameter's start must be
known (the simulation starts there). ReLUs get the ``sigmoid(α·z)`` derivative so that the
second-order terms move ``x̂``. The cost of one step is about ``3·S`` forward-backward passes.

``run="exact"``: the owner's whole recipe instead (:mod:`exhume.attacks.exact`: every step of the
stated optimiser on the batches its sampler drew, one candidate per training point), and the loss
``‖Run(θ_0; x̂, q) − θ_T‖² / ‖θ_T − θ_0‖²``: no step sizes to learn, no start decay to fit, exact ReLUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.attacks.base import DTYPES, Attack, Param, Reconstruction, attack_model, init_record, initial_candidates, register
from exhume.attacks.checkpoint import resumable_settings
from exhume.attacks.equations import Equation, ExactRun, KnownStart
from exhume.attacks.exact import Replay, make_replay, relative_gap, replay, train_mode_failures
from exhume.attacks.exact_lm import ExactLM, check_lm, labelings, lm_stepper, one_hot, parse_labels, parse_schedule, replay_logits
from exhume.attacks.formulation import candidate_labels
from exhume.attacks.loop import BACKGROUND, CANDIDATE_PARAMS, START_DECAY, attack_loop, budget_params, descend, make_optimizer, open_run
from exhume.attacks.priors import background_level, dark_floor, range_penalty, tv_term
from exhume.attacks.record import SolvedEquation
from exhume.attacks.subspace import Subspace, data_subspace
from exhume.attacks.surrogate import soft_activations
from exhume.attacks.trajectory import PRECONDITIONERS, StartEquation, added_inputs_layer, build_equation, per_sample, probe_images
from exhume.errors import ConfigError, DivergenceError
from exhume.replay import check_exact, recipe
from exhume.starts import start_digest

RUNS = ("coarse", "exact")
SOLVERS = ("adam", "lm")
#: why an exact run of an Adam recipe overflows: Adam's step m̂/(√v̂ + ε) has sensitivity ~1/|g| to a gradient g, compounded
#: over the run's steps (a tiny Adam victim's gap gradient: 1e49 from candidates at init_scale 1.7e-3, 0.1 at 0.3)
ADAM_OVERFLOW = ("the replayed Adam steps amplify the tiny gradients of candidates near the data mean beyond float32 "
                 "(raise init_scale to 0.1 or more, or dtype='float64')")


@dataclass
class SimProblem:
    """The working copy, the target, and the unknowns: candidates ``x``, label logits ``l``, log step sizes ``rho``."""

    model: nn.Module
    eq: StartEquation
    start: dict[str, torch.Tensor]  # θ_0 on the equation's parameters
    rest: dict[str, torch.Tensor]  # the other parameters (frozen: equal to their start)
    base_lr: float
    task: str
    mean: torch.Tensor
    y: torch.Tensor  # the candidates' fixed classes (where their soft labels start)
    x: torch.Tensor
    logits: torch.Tensor
    rho: torch.Tensor
    span: Subspace
    replay: Replay | None = None  # the exact run (None: the coarse simulation)
    final: dict[str, torch.Tensor] | None = None  # θ_T on the replay's parameters


def soft_label_loss(task: str, out: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-candidate loss against soft labels: binary ``q·softplus(−Φ) + (1−q)·softplus(Φ)``, ``q = σ(l)``;
    multiclass ``−Σ_k softmax(l)_k log softmax(Φ)_k``."""
    if task == "binary":
        q = torch.sigmoid(logits)
        out = out.reshape(-1)
        return q * nn.functional.softplus(-out) + (1 - q) * nn.functional.softplus(out)
    return -(torch.softmax(logits, 1) * torch.log_softmax(out, 1)).sum(1)


@register
class SimulateAttack(Attack):
    """Reconstruction by simulating training from the known start on learnable candidates (needs a start)."""

    name = "simulate"
    uses_start = True  # it trains from the start
    equation = KnownStart()  # what the simulation approximates; equation_on(view) holds the start for its check
    params = {
        "m": Param(None, int, "number of candidates (default: candidates_per_point × n)", low=1, allow_none=True),
        "candidates_per_point": Param(1.0, float, "m = round(this × n) when m is not given", low=1e-3),
        **{k: v for k, v in CANDIDATE_PARAMS.items() if k != "weight_decay"},  # the simulation has none: c handles the start's decay
        **budget_params(2000, checkpoint_every=200, log_every=50),
        "run": Param("coarse", str, "coarse: S full-batch steps with learnt step sizes; exact: the owner's recipe replayed "
                     "(training settings with sampler and seed; see exhume.attacks.exact)", choices=RUNS),
        "solver": Param("adam", str, "exact run: 'adam' descends on the gap with the candidates' optimiser; 'lm': "
                        "Levenberg–Marquardt with the whole Jacobian, α-continuation and restarts, for small problems "
                        "(exhume.attacks.exact_lm; one iteration: one Jacobian)", choices=SOLVERS),
        "schedule": Param("1,3,10,30", str, "solver lm: the stages' smoothing α, comma-separated, then a polish with the exact derivative"),
        "stage_iterations": Param(15, int, "solver lm: Levenberg–Marquardt iterations per stage", low=1),
        "labels": Param("fixed", str, "exact run: 'fixed' (the candidates' classes), 'enumerate' (solver lm, binary: every "
                        "assignment, one schedule each) or the classes in the training set's order, comma-separated (an assumption)"),
        "segment": Param(None, int, "exact run: steps per checkpointed segment (default: the shortest whose kept states fit 1 GiB)", low=1, allow_none=True),
        "steps": Param(4, int, "simulated full-batch gradient steps S from the start", low=1),
        "lr_labels": Param(1e-2, float, "learning rate of the soft labels' logits", low=0.0),
        "lr_rates": Param(1e-2, float, "learning rate of the log step sizes ρ_s", low=0.0),
        "step_scale": Param(1.0, float, "multiplies the simulation's step size η (see the module docstring)", low=1e-6),
        "alpha": Param(19.0, float, "ReLU surrogate derivative sigmoid(α·z); exact run: the run stays exact, only ReLU's step "
                       "gets the derivative α·σ'(α·z) (exhume.attacks.exact.smoothed_step)", low=0.0),
        "init_scale": Param(1.7e-3, float, "x̂ ~ N(0,1)·init_scale in centred space", low=0.0),
        "prior_weight": Param(1.0, float, "weight of the pixel-range prior (display range [0, 1])", low=0.0),
        "tv_weight": Param(0.0, float, "weight of the total-variation prior on image candidates (0 = off)", low=0.0),
        "start_decay": START_DECAY,
        "preconditioner": Param("auto", str, "Adam's √v̂ + ε on what training added (as kkt's)", choices=PRECONDITIONERS),
        "subspace": Param("auto", str, "project candidates onto the training inputs' span read from what training added to "
                          "the input layer ('off': do not; 'auto': off for the exact run, whose truth lies only near that span "
                          "where weight decay shrank the start)", choices=("off", "auto")),
        "background": BACKGROUND,
    }

    memory_knobs = {"m": "count", "dtype": "dtype"}

    def effective(self, view, name: str) -> Any:
        if name == "m":
            return self.config["m"] or max(1, round(self.config["candidates_per_point"] * (view.n_train_hint or 100)))
        return super().effective(view, name)

    def peak_memory_bytes(self, view) -> int:
        """A rough bound, not fitted (no measured coefficients yet): the simulated steps keep their graph, so
        :func:`~exhume.attacks.memory.generic_peak` of the ``m`` candidates, times the steps plus one."""
        from exhume.attacks import memory as mem

        return int(mem.BASE_BYTES + (self.config["steps"] + 1) * mem.generic_peak(self, view))

    def equation_used(self, view) -> str:
        """The equation a run solves: training simulated from the start (its check: the known-start
        residual, :func:`exhume.attacks.trajectory.known_start_residual`), or the exact run (its own residual)."""
        return (SolvedEquation.EXACT_RUN if self.config["run"] == "exact" else SolvedEquation.SIMULATED).value

    def equation_on(self, view) -> Equation:
        """The known-start equation on gradients at the start and the final weights: what the simulation approximates;
        the exact run's own equation with ``run="exact"``."""
        if self.config["run"] == "exact":
            return ExactRun(view=view if getattr(view, "start", None) is not None else None)
        return KnownStart(view=view if getattr(view, "start", None) is not None else None, kind="endpoints",
                          decay=self.config["start_decay"], preconditioner=self.config["preconditioner"],
                          attack_residual=False)  # its final residual is 1 − cos², not this equation's

    def candidate_count(self, n: int) -> int:
        """How many candidates one run makes for ``n`` training points."""
        return self.config["m"] or max(1, round(self.config["candidates_per_point"] * n))

    def check(self, view) -> None:
        if view.start is None:
            raise ConfigError("the simulate attack trains from the starting weights: pass start=... (--start-weights FILE)")
        if view.task not in ("binary", "multiclass"):
            raise ConfigError(f"the simulate attack handles classifiers; the victim's task is {view.task!r}")
        if self.config["tv_weight"] > 0 and len(view.input_shape) != 3:
            raise ConfigError(f"tv_weight needs image inputs (C, H, W); this victim's input shape is {tuple(view.input_shape)}")
        if self.config["run"] == "exact":
            self.check_exact(view)
        elif self.config["solver"] != "adam":
            raise ConfigError(f"solver {self.config['solver']!r} solves the exact run: it needs run='exact'")

    def check_exact(self, view) -> None:
        """The exact run's needs: the training-set size, a complete and consistent recipe, one candidate a point, layers it replays."""
        n = self.config["n_guess"] or view.n_train_hint
        if not n:
            raise ConfigError("the exact training run needs the number of training points (n_guess=..., or the view's n_train_hint)")
        check_exact(view.training, n)
        if self.config["m"] not in (None, n):
            raise ConfigError(f"the exact training run has one candidate per training point: m must be {n} (or left out), got {self.config['m']}")
        failures = train_mode_failures(view.model)
        if failures:
            raise ConfigError(f"the exact training run cannot be replayed: {failures[0]}")
        check_lm(self.config, view, n)

    def given_classes(self, p: SimProblem, view) -> torch.Tensor:
        """The exact run's labels: ``labels`` given (the training set's order), else the candidates' own classes; the label
        logits set there where they are given or solver lm keeps them (±30: one-hot to rounding, so that a descent keeps
        them too; else the learnt soft labels start as before)."""
        given = parse_labels(self.config["labels"], view.task, p.x.shape[0], int(view.num_classes or 2))
        classes = p.y if given is None else given.to(p.y)
        if given is None and self.config["solver"] != "lm":
            return classes
        with torch.no_grad():
            p.logits.copy_(replay_logits(p.task, one_hot(p.task, classes, int(view.num_classes or 2))))
        return classes

    def lm_solver(self, p: SimProblem, view, seed: int, classes: torch.Tensor) -> ExactLM:
        """The Levenberg–Marquardt solver of the exact run (see :mod:`exhume.attacks.exact_lm`)."""
        cfg, k = self.config, int(view.num_classes or 2)
        labs = labelings(p.task, p.x.shape[0]) if cfg["labels"] == "enumerate" else None
        final = torch.cat([p.final[name].reshape(-1) for name in p.replay.names])
        return ExactLM(p.replay, final, one_hot(p.task, classes, k).to(p.x), parse_schedule(cfg["schedule"]),
                       cfg["stage_iterations"], cfg["init_scale"], torch.Generator().manual_seed(seed + 1),
                       labelings=None if labs is None else [v.to(p.x) for v in labs])

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 100, init: torch.Tensor | None = None,
            init_name: str = "noise") -> Reconstruction:
        """Run the attack on ``view`` (an AttackerView with a start); the protocol of :meth:`exhume.attacks.kkt.KKTAttack.run`."""
        self.check(view)
        cfg = self.config
        p = self.problem(view, torch.device(device), seed, init)
        opts = {"opt_x": make_optimizer(cfg["optimizer"], [p.x], cfg["lr"]),
                "opt_l": make_optimizer(cfg["optimizer"], [p.logits], cfg["lr_labels"]),
                "opt_r": make_optimizer(cfg["optimizer"], [p.rho], cfg["lr_rates"])}
        run = open_run(out, resume, {"x": p.x, "logits": p.logits, "rho": p.rho}, opts,
                       {"config": resumable_settings(cfg), "seed": seed, "m": p.x.shape[0], "start": start_digest(view.start)},
                       defaults=self.defaults())
        tau, why = background_level(cfg["background"], view.mean, tuple(view.input_shape))

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                callback(it, elapsed, dark_floor((p.x + p.mean).float(), tau).cpu())

        classes = self.given_classes(p, view) if p.replay is not None else None
        lm = self.lm_solver(p, view, seed, classes) if p.replay is not None and cfg["solver"] == "lm" else None
        step = self.stepper(p, tuple(opts.values()), run.history) if lm is None else lm_stepper(p, lm, run.history)
        end = attack_loop("simulate attack", cfg, run, step, progress=progress, emit=None if callback is None else emit,
                          emit_every=callback_every)
        if lm is not None:
            with torch.no_grad():
                p.logits.copy_(replay_logits(p.task, lm.finish(p.x)))
        with torch.no_grad():
            final = float(self.terms(p)[1]) if lm is None else lm.best_gap()
            candidates = dark_floor((p.x + p.mean).float(), tau).cpu()
            labels = (torch.where(p.logits > 0, 1.0, -1.0) if p.task == "binary" else p.logits.argmax(1)).cpu()
        return Reconstruction(
            method=self.name, candidates=candidates, labels=labels, scores=None,
            config={**cfg, "m": p.x.shape[0], "threat_model": view.threat_model, "equation_used": self.equation_used(view),
                    **({} if p.replay is None else {"recipe": recipe(view.training), "replayed_steps": len(p.replay.order),
                                                    "replay_segment": p.replay.segment}),
                    "simulation_base_lr": p.base_lr, **{f"start_{k}" if not k.startswith("start_") else k: v
                                                         for k, v in p.eq.info.items() if k != "equation"},
                    "start_digest": start_digest(view.start), **p.span.info, **init_record(init_name),
                    "background_used": tau, "background_reason": why},
            seed=seed, loss_history=run.history,
            summary={"iterations": end.done, "seconds": round(end.elapsed, 3), "final_relative_stationarity": final,
                     "final_relative_stationarity_note": "1 − cos² between what training added and the simulated change"
                     if p.replay is None else "‖Run(θ_0; candidates) − θ_T‖² / ‖θ_T − θ_0‖², the exact run's relative gap",
                     "threat_model": view.threat_model, "step_sizes": (p.base_lr * p.rho.detach().exp()).tolist()})

    def problem(self, view, dev: torch.device, seed: int, init: torch.Tensor | None) -> SimProblem:
        cfg = self.config
        dtype = DTYPES[cfg["dtype"]]
        model, params = attack_model(view.model, dev, dtype)
        exact = cfg["run"] == "exact"
        n = cfg["n_guess"] or view.n_train_hint or 100
        m = n if exact else cfg["m"] or (init.shape[0] if init is not None else max(1, round(cfg["candidates_per_point"] * n)))
        eq = build_equation(view, model, params, "trajectory", n, cfg["start_decay"], cfg["preconditioner"])
        unknown = eq.info["start_unknown_parameters"]
        if unknown:
            raise ConfigError(f"the simulate attack starts training from the start: parameter {unknown[0]!r} has none "
                              "(a partial start); use kkt, or a start that covers every trained parameter")
        start = {k: view.start[k].to(params[k]) for k in eq.names}
        rest = {k: v for k, v in params.items() if k not in eq.names}
        labels = candidate_labels(view.task, m, view.num_classes, dtype)
        gen = torch.Generator().manual_seed(seed)
        x = initial_candidates(init, m, view.input_shape, view.mean, cfg["init_scale"], gen, dtype).to(dev).requires_grad_()
        k = int(view.num_classes or 2)
        logits = (3.0 * labels if view.task == "binary" else 3.0 * nn.functional.one_hot(labels.long(), k).to(dtype)).to(dev)
        span = Subspace(None)
        if cfg["subspace"] != "off" and not exact:
            added, info = added_inputs_layer(eq, params, start, math.prod(view.input_shape))
            span = data_subspace(model, added, tuple(view.input_shape), n, precision=next(view.model.parameters()).dtype)
            span.info.update(info)
            with torch.no_grad():
                x.copy_(span.project(x))
        mean = view.mean.to(dev, dtype)
        base = 0.0 if exact else cfg["step_scale"] * self.base_step(model, eq, start, mean, labels, m, view.task)
        rp = make_replay(model, params, view.start, view.training, m, view.task, cfg["segment"], cfg["alpha"]) if exact else None
        return SimProblem(model, eq, start, rest, base, view.task, mean, labels.to(dev), x, logits.requires_grad_(),
                          torch.zeros(0 if exact else cfg["steps"], dtype=dtype, device=dev, requires_grad=True), span, rp,
                          None if rp is None else {k: params[k].detach() for k in rp.names})

    def base_step(self, model, eq: StartEquation, start, mean, labels, m: int, task: str) -> float:
        """``η`` such that ``S`` steps of a mean gradient over ``m`` candidates of probe-sized gradients move ``‖target‖``.

        A probe image's loss gradient has norm about ``γ/2`` (:func:`exhume.attacks.trajectory.probe_images`); the mean of
        ``m`` incoherent ones ``γ/(2√m)``; so ``η = 2·√m·‖target‖/(S·γ)``. Weights and the data mean only.
        """
        x = probe_images(mean, 16)
        obj = (lambda out, y: out.reshape(-1)) if task == "binary" else (lambda out, y: out.gather(1, y.long()[:, None])[:, 0])
        at_start = StartEquation(eq.names, [{**eq.points[0], **start}], eq.target, None, eq.norm2)
        ys = labels.repeat(math.ceil(16 / max(1, len(labels))))[:16].to(mean.device)
        gamma = float(per_sample(model, at_start, x, ys, obj).double().pow(2).sum(1).mean().sqrt())
        return 2.0 * math.sqrt(m) * math.sqrt(eq.norm2) / (self.config["steps"] * max(gamma, 1e-30))

    def simulate(self, p: SimProblem, x: torch.Tensor, logits: torch.Tensor, rho: torch.Tensor) -> dict[str, torch.Tensor]:
        """``θ^(S) − θ_0`` over the equation's parameters (differentiable in ``x``, the labels and the step sizes)."""
        if p.replay is not None:
            q = torch.sigmoid(logits) if p.task == "binary" else torch.softmax(logits, 1)
            theta = replay(p.replay, x, q)
            return {k: theta[k] - p.start[k] for k in p.eq.names}
        theta = dict(p.start)

        def loss(sub):
            return soft_label_loss(p.task, functional_call(p.model, {**p.rest, **sub}, (x,)), logits).mean()

        with soft_activations(self.config["alpha"]):
            for s in range(rho.shape[0]):
                g = grad(loss)(theta)
                eta = p.base_lr * rho[s].exp()
                theta = {k: theta[k] - eta * g[k] for k in p.eq.names}
        return {k: theta[k] - p.start[k] for k in p.eq.names}

    def terms(self, p: SimProblem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, 1 − cos², prior)``: the module docstring's loss and how much of what training added is left unexplained."""
        cfg = self.config
        d = self.simulate(p, p.x, p.logits, p.rho)
        v = p.x + p.mean
        rng = range_penalty(v, 0.0, 1.0)
        prior = cfg["prior_weight"] * rng + (cfg["tv_weight"] * tv_term(v) if cfg["tv_weight"] > 0 else 0.0)
        if p.replay is not None:  # the exact run: the relative squared gap to the final weights
            gap = relative_gap(p.replay, {k: p.start[k] + d[k] for k in p.eq.names}, p.final)
            return gap + prior, gap, rng
        t, dd = p.eq.target, d
        if p.eq.direction is not None:  # project the start's direction off both (its decay c is free)
            u = p.eq.direction
            u2 = sum((u[k] ** 2).sum() for k in p.eq.names)
            ct = sum((u[k] * t[k]).sum() for k in p.eq.names) / u2
            cd = sum((u[k] * d[k]).sum() for k in p.eq.names) / u2
            t = {k: t[k] - ct * u[k] for k in p.eq.names}
            dd = {k: d[k] - cd * u[k] for k in p.eq.names}
        dot = sum((t[k] * dd[k]).sum() for k in p.eq.names)
        cos = dot / (math.sqrt(p.eq.norm2) * torch.sqrt(sum((dd[k] ** 2).sum() for k in p.eq.names)).clamp_min(1e-30))
        return (1.0 - cos) + prior, 1.0 - cos**2, rng

    def stepper(self, p: SimProblem, opts: tuple[torch.optim.Optimizer, ...], history: list[dict[str, Any]]):
        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            loss, unexplained, prior = self.terms(p)
            if not torch.isfinite(loss):
                raise DivergenceError(f"simulate attack diverged at iteration {it}; lower lr or step_scale")
            descend(loss, opts, p.span, p.x)
            if not bool(torch.isfinite(p.x).all()):
                raise DivergenceError(f"simulate attack diverged at iteration {it}: non-finite candidates; "
                                      + ("lower lr" if p.replay is None or p.replay.settings.optimizer == "sgd" else ADAM_OVERFLOW))
            if not log:
                return None
            history.append({"iteration": it, "loss": float(loss.detach()), "unexplained": float(unexplained.detach()),
                            "prior": float(prior.detach()), "seconds": round(clock(), 3)})
            return {"left": f"{float(unexplained.detach()):.3g}"}

        return step

