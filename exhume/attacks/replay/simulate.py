"""The exact training run as an attack (``method="simulate"``), for an owner who knows the whole recipe.

With the start ``θ_0`` and the recipe (:mod:`exhume.equations.exact`: every step of the stated optimiser
on the batches its sampler drew), train a copy from ``θ_0`` on ``n`` candidates ``x̂`` with label logits
``l`` (binary: ``q = σ(l)`` the probability of +1; multiclass: ``softmax(l)``), one candidate per
training point, and move the candidates so that the replayed run lands on the final weights::

    loss = ‖Run(θ_0; x̂, q) − θ_T‖² / ‖θ_T − θ_0‖²  + prior_weight · range

``solver="adam"`` descends on it with the candidates' optimiser; ``solver="lm"`` solves it by
Levenberg–Marquardt with the run's whole Jacobian, for problems small enough to form it
(:mod:`exhume.attacks.replay.lm`). Every trained parameter's start must be known.

``simulate`` names the exact run alone (the coarse simulation left the package: research/README.md); older run folders
of method ``simulate`` load and evaluate, and an exact run's checkpoint or settings with ``run="exact"`` resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exhume.attacks.engine.base import DTYPES, Attack, Param, Reconstruction, attack_model, initial_candidates, register
from exhume.attacks.engine.checkpoint import resumable_settings
from exhume.attacks.engine.loop import BACKGROUND, CANDIDATE_PARAMS, attack_loop, budget_params, descend, make_optimizer, open_run
from exhume.attacks.engine.priors import background_level, dark_floor, range_penalty
from exhume.attacks.engine.record import RunRecord
from exhume.attacks.replay.lm import ExactLM, check_lm, lm_stepper, one_hot, parse_labels, parse_schedule, replay_logits
from exhume.deadline import NEVER, Deadline
from exhume.equations.exact import Replay, make_replay, relative_gap, replay, train_mode_failures
from exhume.equations.formulation import candidate_labels
from exhume.equations.kinds import ExactRun, SolvedEquation
from exhume.equations.recipe import check_exact, recipe
from exhume.errors import ConfigError, DivergenceError
from exhume.starts import start_digest

SOLVERS = ("adam", "lm")
#: why an exact run of an Adam recipe overflows: Adam's step m̂/(√v̂ + ε) has sensitivity ~1/|g| to a gradient g, compounded
#: over the run's steps (a tiny Adam victim's gap gradient: 1e49 from candidates at init_scale 1.7e-3, 0.1 at 0.3)
ADAM_OVERFLOW = ("the replayed Adam steps amplify the tiny gradients of candidates near the data mean beyond float32 "
                 "(raise init_scale to 0.1 or more, or dtype='float64')")
#: the coarse simulation's settings, gone with it, at the values a run of the exact one recorded, and its never-measured
#: total-variation prior, off (Attack.retired)
RETIRED: dict[str, tuple[Any, ...]] = {
    "run": ("exact",), "m": (None,), "candidates_per_point": (1.0,), "steps": (4,), "lr_rates": (1e-2,), "step_scale": (1.0,),
    "start_decay": ("auto",), "preconditioner": ("auto",), "subspace": ("auto",), "tv_weight": (0.0, 0)}


@dataclass
class ExactProblem:
    """The working copy's replay, the final weights, and the unknowns: candidates ``x`` and label logits."""

    replay: Replay
    final: dict[str, torch.Tensor]  # θ_T on the replay's parameters
    task: str
    mean: torch.Tensor
    y: torch.Tensor  # the candidates' fixed classes (where their soft labels start)
    x: torch.Tensor
    logits: torch.Tensor


@register
class SimulateAttack(Attack):
    """Reconstruction by replaying the owner's whole training run from the known start (needs a start and the recipe)."""

    name = "simulate"
    uses_start = True  # it trains from the start
    equation = ExactRun()  # without the view's start and recipe its check cannot be made (equation_on(view) holds them)
    retired = RETIRED
    checkpoint_every, log_every = 200, 50
    params = {
        **CANDIDATE_PARAMS,
        **budget_params(2000),
        "solver": Param("adam", str, "'adam' descends on the gap with the candidates' optimiser; 'lm': Levenberg–Marquardt "
                        "with the whole Jacobian, α-continuation and restarts, for small problems "
                        "(exhume.attacks.replay.lm; one iteration: one Jacobian)", choices=SOLVERS),
        "schedule": Param("1,3,10,30", str, "solver lm: the stages' smoothing α, comma-separated, then a polish with the exact derivative"),
        "stage_iterations": Param(15, int, "solver lm: Levenberg–Marquardt iterations per stage", low=1),
        "labels": Param("fixed", str, "'fixed' (the candidates' classes) or the classes in the training set's order, "
                        "comma-separated (an assumption)"),
        "segment": Param(None, int, "steps per checkpointed segment (default: the shortest whose kept states fit 1 GiB)", low=1, allow_none=True),
        "lr_labels": Param(1e-2, float, "learning rate of the soft labels' logits", low=0.0),
        "alpha": Param(19.0, float, "the run stays exact; only ReLU's step gets the derivative α·σ'(α·z) "
                       "(exhume.equations.exact.smoothed_step)", low=0.0),
        "init_scale": Param(1.7e-3, float, "x̂ ~ N(0,1)·init_scale in centred space", low=0.0),
        "prior_weight": Param(1.0, float, "weight of the pixel-range prior (display range [0, 1])", low=0.0),
        "background": BACKGROUND,
    }

    memory_knobs = {"dtype": "dtype"}  # no count: one candidate per training point

    def peak_memory_bytes(self, view) -> int:
        """A rough bound, not fitted (no measured coefficients yet): five times
        :func:`~exhume.attacks.engine.memory.generic_peak` of the ``n`` candidates (a segment's graph and its recomputation)."""
        from types import SimpleNamespace

        from exhume.attacks.engine import memory as mem

        counted = SimpleNamespace(config={"m": self.config["n_guess"] or view.n_train_hint, "dtype": self.config["dtype"]})
        return int(mem.BASE_BYTES + 5 * mem.generic_peak(counted, view))

    def equation_on(self, view) -> ExactRun:
        """The exact run's own equation on ``view`` (its check needs the start and the recipe)."""
        return ExactRun(view=view if getattr(view, "start", None) is not None else None)

    def candidate_count(self, n: int) -> int:
        """One candidate per training point."""
        return self.config["n_guess"] or n

    def check(self, view) -> None:
        """The exact run's needs: a start, a classifier, the training-set size, a complete and consistent recipe, layers
        it replays, and settings its solver honours."""
        if view.start is None:
            raise ConfigError("the simulate attack trains from the starting weights: pass start=... (--start-weights FILE)")
        if view.task not in ("binary", "multiclass"):
            raise ConfigError(f"the simulate attack handles classifiers; the victim's task is {view.task!r}")
        n = self.config["n_guess"] or view.n_train_hint
        if not n:
            raise ConfigError("the exact training run needs the number of training points (n_guess=..., or the view's n_train_hint)")
        check_exact(view.training, n)
        failures = train_mode_failures(view.model)
        if failures:
            raise ConfigError(f"the exact training run cannot be replayed: {failures[0]}")
        check_lm(self.config, view, n)

    def given_classes(self, p: ExactProblem, view) -> torch.Tensor:
        """The labels: ``labels`` given (the training set's order), else the candidates' own classes; the label
        logits set there where they are given or solver lm keeps them (±30: one-hot to rounding, so that a descent keeps
        them too; else the learnt soft labels start as before)."""
        given = parse_labels(self.config["labels"], view.task, p.x.shape[0], int(view.num_classes or 2))
        classes = p.y if given is None else given.to(p.y)
        if given is None and self.config["solver"] != "lm":
            return classes
        with torch.no_grad():
            p.logits.copy_(replay_logits(p.task, one_hot(p.task, classes, int(view.num_classes or 2))))
        return classes

    def lm_solver(self, p: ExactProblem, view, seed: int, classes: torch.Tensor) -> ExactLM:
        """The Levenberg–Marquardt solver (see :mod:`exhume.attacks.replay.lm`)."""
        cfg = self.config
        final = torch.cat([p.final[name].reshape(-1) for name in p.replay.names])
        return ExactLM(p.replay, final, one_hot(p.task, classes, int(view.num_classes or 2)).to(p.x),
                       parse_schedule(cfg["schedule"]), cfg["stage_iterations"], cfg["init_scale"],
                       torch.Generator().manual_seed(seed + 1))

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 100, init: torch.Tensor | None = None,
            init_name: str = "noise", deadline: Deadline = NEVER, checkpoint_every: int | None = None,
            log_every: int | None = None, owner=None) -> Reconstruction:
        """Run the attack on ``view`` (an AttackerView with a start and a recipe); the protocol of
        :meth:`exhume.attacks.kkt.KKTAttack.run`."""
        self.check(view)
        cfg, every = self.config, self.cadence(checkpoint_every, log_every)
        p = self.problem(view, torch.device(device), seed, init)
        opts = {"opt_x": make_optimizer(cfg["optimizer"], [p.x], cfg["lr"]),
                "opt_l": make_optimizer(cfg["optimizer"], [p.logits], cfg["lr_labels"])}
        run = open_run(out, resume, {"x": p.x, "logits": p.logits}, opts,
                       {"config": resumable_settings(cfg), "seed": seed, "m": p.x.shape[0], "start": start_digest(view.start)},
                       defaults=self.defaults(), retired=self.retired_on(view), owner=owner)
        tau, why = background_level(cfg["background"], view.mean, tuple(view.input_shape))

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                callback(it, elapsed, dark_floor((p.x + p.mean).float(), tau).cpu())

        classes = self.given_classes(p, view)
        lm = self.lm_solver(p, view, seed, classes) if cfg["solver"] == "lm" else None
        step = self.stepper(p, tuple(opts.values()), run.history) if lm is None else lm_stepper(p, lm, run.history)
        end = attack_loop("simulate attack", cfg["iterations"], run, step, deadline, every, progress=progress,
                          emit=None if callback is None else emit, emit_every=callback_every)
        with torch.no_grad():
            if lm is not None:
                p.logits.copy_(replay_logits(p.task, lm.finish(p.x)))
            final = float(self.terms(p)[1]) if lm is None else lm.best_gap()
            candidates = dark_floor((p.x + p.mean).float(), tau).cpu()
            labels = (torch.where(p.logits > 0, 1.0, -1.0) if p.task == "binary" else p.logits.argmax(1)).cpu()
        return Reconstruction(
            method=self.name, candidates=candidates, labels=labels, scores=None,
            record=RunRecord(
                iterations=end.done, seconds=round(end.elapsed, 3), final_relative_stationarity=final,
                final_relative_stationarity_note="‖Run(θ_0; candidates) − θ_T‖² / ‖θ_T − θ_0‖², the exact run's relative gap",
                threat_model=view.threat_model, equation=SolvedEquation.EXACT_RUN, init=init_name,
                settings={**cfg, "m": p.x.shape[0], "recipe": recipe(view.training), "replayed_steps": len(p.replay.order),
                          "replay_segment": p.replay.segment, "replayed_parameters": list(p.replay.names),
                          "start_digest": start_digest(view.start), "background_used": tau, "background_reason": why}),
            seed=seed, loss_history=run.history)

    def problem(self, view, dev: torch.device, seed: int, init: torch.Tensor | None) -> ExactProblem:
        """The replay on the working copy and ``n`` candidates drawn from ``seed`` (or ``init``), their logits at their classes."""
        cfg = self.config
        dtype = DTYPES[cfg["dtype"]]
        model, params = attack_model(view.model, dev, dtype)
        unknown = [k for k in params if k not in view.start]
        if unknown:
            raise ConfigError(f"the simulate attack starts training from the start: parameter {unknown[0]!r} has none "
                              "(a partial start); use kkt, or a start that covers every trained parameter")
        n = cfg["n_guess"] or view.n_train_hint
        labels = candidate_labels(view.task, n, view.num_classes, dtype)
        x = initial_candidates(init, n, view.input_shape, view.mean, cfg["init_scale"], torch.Generator().manual_seed(seed),
                               dtype).to(dev).requires_grad_()
        k = int(view.num_classes or 2)
        logits = (3.0 * labels if view.task == "binary" else 3.0 * nn.functional.one_hot(labels.long(), k).to(dtype)).to(dev)
        rp = make_replay(model, params, view.start, view.training, n, view.task, cfg["segment"], cfg["alpha"])
        return ExactProblem(rp, {k: params[k].detach() for k in rp.names}, view.task, view.mean.to(dev, dtype),
                            labels.to(dev), x, logits.requires_grad_())

    def terms(self, p: ExactProblem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, gap, range)``: the module docstring's loss, the relative gap to the final weights, the range penalty."""
        q = torch.sigmoid(p.logits) if p.task == "binary" else torch.softmax(p.logits, 1)
        gap = relative_gap(p.replay, replay(p.replay, p.x, q), p.final)
        rng = range_penalty(p.x + p.mean, 0.0, 1.0)
        return gap + self.config["prior_weight"] * rng, gap, rng

    def stepper(self, p: ExactProblem, opts: tuple[torch.optim.Optimizer, ...], history: list[dict[str, Any]]):
        """The attack loop's step of ``solver="adam"``: one descent on the gap and the prior."""
        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            loss, gap, prior = self.terms(p)
            if not torch.isfinite(loss):
                raise DivergenceError(f"simulate attack diverged at iteration {it}; lower lr")
            descend(loss, opts, None, p.x)
            if not bool(torch.isfinite(p.x).all()):
                raise DivergenceError(f"simulate attack diverged at iteration {it}: non-finite candidates; "
                                      + ("lower lr" if p.replay.settings.optimizer == "sgd" else ADAM_OVERFLOW))
            if not log:
                return None
            history.append({"iteration": it, "loss": float(loss.detach()), "unexplained": float(gap.detach()),
                            "prior": float(prior.detach()), "seconds": round(clock(), 3)})
            return {"left": f"{float(gap.detach()):.3g}"}

        return step
