"""The kkt attack's class: its protocol (equation, restart plan, presets, memory estimate), its run and its result."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from exhume.attacks.engine.base import Attack, Reconstruction, RestartPlan, register
from exhume.attacks.engine.checkpoint import BUDGET_SETTINGS, resumable_settings
from exhume.attacks.engine.loop import LoopEnd, attack_loop, make_optimizer, open_run
from exhume.attacks.engine.priors import background_level, dark_floor
from exhume.attacks.engine.record import RunRecord
from exhume.attacks.engine.snapshots import IterateTracker
from exhume.attacks.kkt import problem as problem_mod
from exhume.attacks.kkt import stage as feature_stage
from exhume.attacks.kkt.problem import Problem
from exhume.attacks.kkt.settings import PARAMS, PRESETS, RETIRED, SNAPSHOT_EVERY, SPAN_PENALTY, candidate_count, check, equation_for, resolve_lr_lambda
from exhume.attacks.kkt.step import Step, stationarity_for
from exhume.attacks.kkt.subspace import Subspace, remembered_input_layer
from exhume.attacks.kkt.terms import criterion, residual, solved_u, terms
from exhume.deadline import NEVER, Deadline
from exhume.equations.formulation import form_for
from exhume.equations.kinds import Equation, KnownStart, SolvedEquation, Stationarity
from exhume.equations.trajectory import forgotten_start, start_decay_for
from exhume.models.tap import features_of
from exhume.starts import start_digest


class _Finished(NamedTuple):
    """What :meth:`KKTAttack.result` reads of a run's state, for a run whose loop happened elsewhere (the feature stage)."""

    history: list[dict[str, Any]]


@register
class KKTAttack(Attack):
    """Stationarity (KKT) reconstruction from the weights alone: binary, multiclass, regression."""

    name = "kkt"
    equation = Stationarity(multiplier_scale=True)  # S is set from the weights alone: checked against the real margins
    # restarts alternate lr_lambda 1e-4 ('auto' for classifiers; 1e-2 for regression) and 1e-2: the equation leaves the
    # multipliers' scale free; learned fast it drifts on some victims and must move on others, so the alternation hedges
    # (variants of the λ scale and of α did not pay): docs/METHODS.md §5, docs/defaults.md
    restart_plan = RestartPlan(variants=({}, {"lr_lambda": 1e-2}))
    multipliers = True
    uses_start = True  # a start in the view switches the equation (start_equation="auto")
    batchable = True  # exhume/portfolio/batched/ stacks its restarts
    uses_records = ("known",)  # the informed adversary: candidates ranked by what the known records leave (informed)
    params = PARAMS
    presets = PRESETS
    retired = RETIRED
    checkpoint_every, log_every = 1000, 100
    memory_knobs = {"m": "count", "dtype": "dtype"}

    def equation_used(self, view) -> str:
        """The equation a run on ``view`` solves: 'stationary', or with a start 'trajectory' / 'endpoints'
        (:mod:`exhume.equations.trajectory`, whose :func:`~exhume.evaluation.residuals.known_start_residual` is its check)."""
        return equation_for(self.config["start_equation"], view)

    def equation_on(self, view) -> Equation:
        """Stationarity, or with ``start_equation`` other than 'stationary' the known-start equation (its check)."""
        used = self.equation_used(view)
        if used == "stationary":
            return self.equation
        return KnownStart(view=view if getattr(view, "start", None) is not None else None, kind=used,
                          decay=self.config["start_decay"], preconditioner=self.config["preconditioner"],
                          formulation=self.config["formulation"], nonnegative=True)

    def effective(self, view, name: str) -> Any:
        if name == "m":
            return candidate_count(self.config["m"], self.config["candidates_per_point"], self.config["n_guess"] or view.n_train_hint or 100)
        return super().effective(view, name)

    def peak_memory_bytes(self, view) -> int:
        """Peak bytes from the victim's parameters ``P``, input size ``D``, activations per input ``A``, the candidates ``m`` and
        the dtype's bytes ``b``: the larger of the set-up (SVDs of the weights in float64: ``5.2·8P + 1.4·m·D·b``) and the
        steps (``6.8·P·b + 14.9·m·D·b + 5.2·m·A·b``), coefficients measured (``benchmarks/memory_estimate.py``)."""
        from exhume.attacks.engine import memory as mem

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
        form = form_for(view, self.config["formulation"])
        return {**super().search_start(view), "lr_lambda": resolve_lr_lambda(self.config["lr_lambda"], form)}

    def check(self, view) -> None:
        check(self.config, view)

    def informed(self, view, recon: Reconstruction) -> Reconstruction:
        """With training records known (the informed adversary): where every record but one is known and the first layer
        reads it (:func:`exhume.attacks.kkt.read.read_target`), the read's two images first and named; after them (and
        named where there is no read) the solve's candidates ranked by the share of what the known records leave of the
        equation each explains (:func:`exhume.attacks.kkt.game.rank`), best first (docs/METHODS.md §7)."""
        from exhume.attacks.kkt.game import rank
        from exhume.attacks.kkt.read import read_target

        if view.known is None:
            return recon
        n = int(self.config["n_guess"] or view.n_train_hint or len(view.known) + 1)
        read = read_target(view, n)
        cand, labels, prov = recon.candidates, recon.labels, dict(recon.provenance)
        if read.candidates is not None:
            cand = torch.cat([read.candidates.to(cand), cand])
            labels = torch.cat([_predicted(view.model, read.candidates - view.mean, labels), labels])
            prov = {k: torch.cat([torch.full((2,), -1, dtype=v.dtype), v]) for k, v in prov.items()}
        order, shares, info = rank(view, cand.clamp(0, 1), labels, self.config["start_equation"])
        if read.candidates is not None:  # the read's images lead, whatever their share
            order = torch.cat([torch.arange(2), order[order >= 2]])
        unknown = max(1, n - len(view.known))
        named = 2 if read.candidates is not None else min(len(order), max(1, round(self.config["candidates_per_point"] * unknown)))
        info = {**info, **read.info, "informed_read": read.why, "informed_named": named}
        record = dataclasses.replace(recon.record, threat_model=view.threat_model, settings={**recon.record.settings, **info},
                                     extras={**recon.record.extras, "multipliers": recon.scores.tolist() if recon.scores is not None else None})
        return dataclasses.replace(recon, candidates=cand[order], labels=labels[order], scores=shares[order].float(),
                                   record=record, provenance={k: v[order] for k, v in prov.items()})

    def stage_on(self, view, model=None) -> feature_stage.Found | None:
        """Whether a run on ``view`` reads the span one layer up, the one predicate lone and batched restarts ask, where
        the input enters through no linear map (:func:`~exhume.attacks.kkt.stage.layer_above`, at the victim's precision):
        without a start, with ``subspace="auto"`` and the stationary equation, the layer whose weights show the span (the
        feature stage); with a start and the known-start equation, unless ``span_penalty=0``, the layer whose added part
        ``W − c·W_0`` shows it (``c`` by ``start_decay``'s rule; the span penalty, ``added``). That layer, cut, and its
        span; None elsewhere. ``model``: the attack's working copy to cut (default the view's)."""
        cfg = self.config
        stationary = equation_for(cfg["start_equation"], view) == "stationary"
        if view.start is None and (cfg["subspace"] != "auto" or not stationary):
            return None
        if view.start is not None and (stationary or cfg["span_penalty"] in (0, 0.0)):
            return None
        model = view.model if model is None else model
        if remembered_input_layer(view.model, model, dict(model.named_parameters()), tuple(view.input_shape)) is not None:
            return None  # the input enters through a linear map: its span, or none, is read there
        trained_in = next((w.dtype for w in view.model.parameters()), None)  # the precision floor is the victim's
        n = int(cfg["n_guess"] or view.n_train_hint or 100)
        if view.start is None:
            return feature_stage.layer_above(model, tuple(view.input_shape), view.mean, n, trained_in)
        c = start_decay_for(view, cfg["start_decay"], n)[0]
        return feature_stage.layer_above(model, tuple(view.input_shape), view.mean, n, trained_in, start=view.start, decay=c)

    def penalty_on(self, view, model) -> tuple[feature_stage.Penalty | None, dict[str, Any]]:
        """The span penalty of a run on ``view`` with the working copy ``model`` (:meth:`stage_on`'s ``added`` layer) and
        what the record keeps of it; ``(None, {})`` without a start."""
        if getattr(view, "start", None) is None:
            return None, {}
        found = self.stage_on(view, model)
        if found is None or not found.added:
            why = ("span_penalty=0" if self.config["span_penalty"] in (0, 0.0) else
                   "the stationary equation" if equation_for(self.config["start_equation"], view) == "stationary" else
                   "no linear layer above a non-linear input layer whose added part (W − c·W_0) shows the span (span_of)")
            return None, {"span_penalty_used": 0.0, "span_penalty_reason": why}
        weight = SPAN_PENALTY if self.config["span_penalty"] == "auto" else float(self.config["span_penalty"])
        info = {**{k.replace("subspace_", "span_penalty_", 1): v for k, v in found.span.info.items() if k != "subspace_used"},
                "span_penalty_used": weight, "span_penalty_layer": found.above.layer}
        return feature_stage.Penalty(found.above.layer, found.span.basis, weight, info), info

    def unbatched_on(self, view) -> str | None:
        """A run that takes the feature stage or the span penalty (:meth:`stage_on`) has no batched path."""
        found = self.stage_on(view)
        if found is None:
            return None
        if found.added:
            return (f"what training added to {found.above.layer} shows the span: each kkt run adds the span penalty on its "
                    "features (exhume/attacks/kkt/stage.py), one restart per process")
        return (f"the input enters through no linear map and {found.above.layer}'s weights show the span: each kkt run "
                "solves it one layer up (exhume/attacks/kkt/stage.py), one restart per process")

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 1000, init: torch.Tensor | None = None,
            init_name: str = "noise", callback_multipliers: bool = False, trace: bool | None = None,
            deadline: Deadline = NEVER, checkpoint_every: int | None = None, log_every: int | None = None,
            owner=None) -> Reconstruction:
        """Run the attack on ``view`` (an :class:`~exhume.victim.AttackerView`) until ``iterations`` or ``deadline``.

        ``out``: folder for checkpoints (every ``checkpoint_every`` iterations and at the end; history every
        ``log_every``; None: the class's cadence); ``resume``: continue from its checkpoint. ``callback(iteration,
        seconds, candidates)`` is called every ``callback_every`` iterations with the display-space candidates (for
        quality-over-time curves; its time is not counted in ``seconds``). ``init``: starting
        candidates in display space (default: noise); ``init_name`` labels them in the result
        (ground-truth, partition and mix initialisations are oracle tools and marked so).
        ``callback_multipliers=True`` also passes the current multipliers ``λ = S·u`` and the labels as the
        keywords ``multipliers`` and ``labels`` (for attacker-side scoring during a hyperparameter search).
        ``trace`` (not a setting: for tests and benchmarks) forces the traced step (True) or the eager one (False);
        None leaves it to the settings and the deadline's seconds (:func:`~exhume.attacks.kkt.settings.traces`).
        ``owner``: whose run its checkpoints are (:class:`~exhume.attacks.engine.checkpoint.RunOwner`; :func:`exhume.attack`'s).
        """
        self.check(view)
        every = self.cadence(checkpoint_every, log_every)
        p = self.problem(view, torch.device(device), seed, init)
        staged = None if init is not None else self.staged(view, p, seed, progress, deadline, out, resume, (checkpoint_every, log_every), owner)
        if staged is not None:  # the span one layer up (exhume/attacks/kkt/stage.py)
            if callback is not None:
                callback(staged.record.iterations, staged.record.seconds, staged.candidates)
            return staged
        opts, tracker, run = self.open_state(view, p, out, resume, seed, owner)
        step = self.stepper(p, opts, run.history, tracker, trace, deadline.seconds)
        tau, why = background_level(self.config["background"], view.mean, tuple(view.input_shape))

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                extra = {"multipliers": (p.form.scale * p.u).float().cpu(), "labels": p.y.cpu()} if callback_multipliers else {}
                callback(it, elapsed, dark_floor((p.x + p.mean).float(), tau).cpu(), **extra)

        end = attack_loop("kkt attack", self.config["iterations"], run, step, deadline, every, progress=progress,
                          emit=None if callback is None else emit, emit_every=callback_every)
        step.close(end.done)
        return self.result(p, end, run, tracker, (tau, why), seed, init_name, view)

    def staged(self, view, p: Problem, seed: int, progress: bool, deadline: Deadline = NEVER, out=None, resume: bool = False,
               every: tuple[int | None, int | None] = (None, None), owner=None) -> Reconstruction | None:
        """Where :meth:`stage_on` finds a layer: kkt on the layers from there up for features in its row space, the
        features inverted to images through the layers below (:mod:`exhume.attacks.kkt.stage`); None elsewhere. The stage
        gets :data:`~exhume.attacks.kkt.stage.STAGE_SHARE` of ``deadline``, the inversion the rest; the stage checkpoints
        in ``out/feature_stage`` and resumes from there, the inversion (1,000 steps at most) runs again."""
        cfg = self.config
        t0 = time.perf_counter()
        found = None if view.start is not None else self.stage_on(view, p.model)  # with a start: the span penalty
        if found is None:
            return None
        above, span, _ = found
        inner = type(self)(**{**cfg, "background": 0.0, "tv_weight": 0.0, "m": p.m, "n_guess": p.n})
        fview = feature_stage.feature_view(view, above)
        folder = feature_stage.stage_folder(out, resume)
        stage = inner.run(fview, folder, seed=seed, device=str(p.mean.device), resume=resume, progress=progress,
                          deadline=deadline.share(feature_stage.STAGE_SHARE), checkpoint_every=every[0], log_every=every[1],
                          owner=owner)
        target = stage.candidates.reshape(stage.candidates.shape[0], -1).to(p.mean) * above.scale
        spent = time.perf_counter() - t0
        images, inversion = feature_stage.invert(p.model, above.layer, target, p.mean, seed, deadline)
        with torch.no_grad():
            p.x.copy_(images - p.mean)
            p.u.copy_(stage.scores.to(p.u).reshape(p.u.shape) / p.form.scale)
        p.span = Subspace(None, feature_stage.summary_of(stage, above, span, spent, inversion))
        end = LoopEnd(stage.record.iterations or 0, time.perf_counter() - t0)
        tracker = IterateTracker({"x": p.x, "u": p.u}, 0.0, SNAPSHOT_EVERY)
        tracker.consider(end.done, criterion(cfg, p))
        tau, why = background_level(cfg["background"], view.mean, tuple(view.input_shape))
        rec = self.result(p, end, _Finished(stage.loss_history), tracker, (tau, why), seed, "noise", view)
        rec.record = dataclasses.replace(
            rec.record, final_relative_stationarity=self._above_residual(inner, fview, stage, p, above),
            final_relative_stationarity_note=f"the equation of the layers from {above.layer} up (the stage's), with the exact "
            "ReLU derivative, at the returned images' features and the stage's multipliers")
        return rec

    @staticmethod
    def _above_residual(inner: KKTAttack, fview, stage: Reconstruction, p: Problem, above) -> float:
        """The stage's equation at the features of ``p.x`` (the inverted images) with the stage's multipliers."""
        q = inner.problem(fview, p.x.device, 0, None)
        with torch.no_grad():
            feats = features_of(p.model, above.layer, p.x).to(q.x) / above.scale
            u = stage.scores.to(q.u).reshape(q.u.shape) / q.form.scale
            return float(residual(q, feats, u, None)[0] / q.norm2)

    def problem(self, view, dev: torch.device, seed: int, init: torch.Tensor | None, shared: Problem | None = None) -> Problem:
        """The working copy of the victim, the equation (:func:`exhume.attacks.kkt.problem.setup`) and this run's starting
        unknowns (:func:`~exhume.attacks.kkt.problem.start`). ``shared``: the problem of another restart on the same victim
        with these settings but its rates, whose working copy, equation and span this one takes (the batched restarts)."""
        if shared is None:
            shared = problem_mod.setup(self.config, self.given, view, dev, init)
            shared.penalty, info = self.penalty_on(view, shared.model)
            shared.form.info.update(info)
        return problem_mod.start(shared, self.config, view, seed, init)

    def open_state(self, view, p: Problem, out, resume: bool, seed: int, owner=None):
        """``((opt_x, opt_u), tracker, run)`` of a run on ``p``: its optimisers, averaged iterates and checkpoint
        (restored in place on ``resume``); shared with the batched restarts (:mod:`exhume.portfolio.batched`)."""
        cfg = self.config
        opt_x = make_optimizer(cfg["optimizer"], [p.x], cfg["lr"])
        opt_u = make_optimizer(cfg["optimizer"], [p.u], p.lr_lambda)
        tracker = IterateTracker({"x": p.x, "u": p.u}, cfg["average_decay"], SNAPSHOT_EVERY)
        run = open_run(out, resume, {"x": p.x, "u": p.u, **tracker.state()}, {"opt_x": opt_x, "opt_u": opt_u},
                       {"config": resumable_settings(cfg, BUDGET_SETTINGS + ("background", "preset")), "seed": seed, "m": p.m,
                        "start": start_digest(view.start)}, defaults=self.defaults(), retired=self.retired_on(view), owner=owner)
        return (opt_x, opt_u), tracker, run

    def stepper(self, p: Problem, opts, history: list[dict[str, Any]], tracker: IterateTracker, trace: bool | None = None,
                seconds: float | None = None) -> Step:
        """The step of a lone run on ``p`` (:class:`~exhume.attacks.kkt.step.Step`), traced or eager as ``trace`` says
        (None: as the settings and ``seconds``, the deadline's, say)."""
        return Step(self.config, p, opts, tracker, history, stationarity_for(self.config, p, trace, seconds))

    def result(self, p: Problem, end, run, tracker: IterateTracker, background: tuple[float, str], seed: int,
               init_name: str, view) -> Reconstruction:
        """The kept iterate as a Reconstruction: display-space candidates, their multipliers, settings and summary."""
        cfg = self.config
        tau, why = background
        kept_x, kept_u = tracker.best["x"], tracker.best["u"]
        with torch.no_grad():
            if p.closed:  # the closed-form multipliers of the kept candidates
                kept_u = solved_u(p, terms(cfg, p, kept_x, kept_u).lam)
            final_stat = float(residual(p, kept_x, kept_u, None)[0] / p.norm2)
            candidates = dark_floor((kept_x + p.mean).float(), tau).cpu()
        lam = (p.form.scale * kept_u).detach().float().cpu()
        averaged = f"exponential moving average (decay {cfg['average_decay']:g})" if cfg["average_decay"] > 0 else "iterate"
        threat, start = self.threat(p, view)
        return Reconstruction(
            method=self.name,
            candidates=candidates,
            labels=p.y.cpu(),
            scores=lam if lam.dim() == 1 else lam[:, -1],
            record=RunRecord(
                iterations=end.done, seconds=round(end.elapsed, 3), final_relative_stationarity=final_stat,
                final_relative_stationarity_note="with the exact ReLU derivative, of the returned iterate"
                + ("; of the known-start equation (what training added)" if p.eq is not None else ""),
                kept_iteration=tracker.best_iteration, init=init_name, **threat,
                settings={**cfg, "m": p.m, "n_guess": p.n, "lambda_scale_value": p.form.scale, "lr_lambda_used": p.lr_lambda,
                          **p.form.info, **p.span.info, **start, "background_used": tau, "background_reason": why},
                extras={"kept_criterion": tracker.best_score, "kept_iterate": f"{averaged}, best snapshot every {SNAPSHOT_EVERY} iterations"}),
            seed=seed,
            loss_history=run.history,
        )

    @staticmethod
    def threat(p: Problem, view) -> tuple[dict[str, Any], dict[str, Any]]:
        """What the attacker knew, the equation it solved and why a known start went unused (its record's), and what it
        took from a known start (its settings)."""
        if p.eq is None:
            unused = None if getattr(view, "start", None) is None else (
                forgotten_start(view.model, view.start) or "the stationary equation (start_equation='stationary' was given)")
            return {"threat_model": view.threat_model, "equation": SolvedEquation.STATIONARY, "start_unused": unused}, {}
        start = {f"start_{k}" if not k.startswith("start_") else k: v for k, v in p.eq.info.items() if k != "equation"}
        start.update(start_digest=start_digest(view.start), training_settings=None if view.training is None else view.training.record())
        return {"threat_model": view.threat_model, "equation": SolvedEquation(p.eq.info["equation"])}, start


def _predicted(model, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The victim's own label for centred inputs ``x``, in the convention of the labels ``like``: the output's sign
    (binary ±1), its largest class (class ids) or the output itself (regression)."""
    with torch.no_grad():
        out = model(x.to(next(model.parameters()).dtype))
    if not like.is_floating_point():
        return out.argmax(-1).to(like)
    binary = bool(((like == 1) | (like == -1)).all())
    return (torch.where(out.reshape(-1) > 0, 1.0, -1.0) if binary else out.reshape(-1)).to(like)
