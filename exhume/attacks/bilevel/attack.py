"""Bilevel reconstruction with implicit differentiation (Runkel et al., docs/METHODS.md §2).

    min_x̂  l(θ*, θ(x̂)) = ‖θ* − θ(x̂)‖²   s.t.  θ(x̂) ∈ argmin_θ E(x̂, θ),
    E(x̂, θ) = (1/m) Σ_j loss(Φ(x̂_j; θ), ŷ_j) + (w/2)‖θ‖²

with the victim's loss and weight decay ``w`` (the weight decay makes the lower level strongly
convex for the affine classifier and keeps its Hessian invertible; ``damping`` adds ``δ·I`` to the
Hessian in the linear solve, by default chosen from a Lanczos estimate of its spectrum: 0 when it
is positive definite). On ReLU networks the lower level has no stationary point (its minimiser sits
on ReLU kinks, :mod:`exhume.attacks.bilevel.lower_level`), so by default it is solved on the smoothed victim
``ReLU → softplus(β·z)/β`` (``smooth=β``), by damped Newton-CG in float64 to ``‖∇_θE‖ ≤ inner_tol``;
affine victims are unaffected. Labels are fixed as in the paper: half the
candidates +1, half −1 (:func:`exhume.equations.formulation.binary_labels`).

Each outer step:

1. **inner training**: warm-started Newton-CG on ``E(x̂, ·)`` from the previous ``θ``
   (the first step starts from the victim's ``θ*``, or from U(0,1) weights as in the paper);
2. **adjoint solve**: ``(H + δI) p = ∇_θ l = 2(θ − θ*)`` by conjugate gradient on
   Hessian-vector products (double backward through one retained graph; ``H`` is never formed);
3. **implicit gradient**: ``∇_x̂ l = −∇_x̂ ⟨∇_θ E(x̂, θ), p⟩`` (one vector-Jacobian product), then
   an Adam (or SGD) step on ``x̂`` and, with ``project``, a projection onto display range [0, 1].

At an exact inner optimum and ``δ = 0`` this is the exact gradient of ``x̂ ↦ l(θ*, θ(x̂))``
(implicit function theorem); ``tests/test_bilevel.py`` checks it against a dense solve and
finite differences in float64. Works on any ``nn.Module`` through ``torch.func.functional_call``.
The attack never sees the training set; ``init``/``init_name`` accept evaluator-built starting
images (ground truth, partition, mixtures), which are labelled oracle in the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from exhume.attacks.bilevel.lower_level import Stop, extreme_eigenvalues, newton_cg, spectral_damping
from exhume.attacks.engine.base import DTYPES, Attack, Param, Reconstruction, attack_model, initial_candidates, register
from exhume.attacks.engine.checkpoint import resumable_settings
from exhume.attacks.engine.loop import CANDIDATE_PARAMS, BudgetSpent, RunState, attack_loop, budget_params, budget_spent, make_optimizer, open_run
from exhume.attacks.engine.priors import project_range
from exhume.attacks.engine.record import RunRecord
from exhume.deadline import NEVER, Deadline
from exhume.equations.formulation import binary_labels
from exhume.equations.kinds import Stationarity
from exhume.equations.surrogate import smooth_activations, soft_activations
from exhume.errors import ConfigError, DivergenceError
from exhume.losses import per_sample_loss


# -- flat parameter vectors ---------------------------------------------------------------------
def flatten(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in params.values()])


def unflatten(vec: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for k, v in like.items():
        out[k] = vec[i:i + v.numel()].view_as(v)
        i += v.numel()
    return out


def inner_objective(model: nn.Module, like: dict[str, torch.Tensor], theta: torch.Tensor, x: torch.Tensor,
                    y: torch.Tensor, loss: str, weight_decay: float) -> torch.Tensor:
    """``E(x, θ) = mean_j loss(Φ(x_j; θ), y_j) + (w/2)‖θ‖²`` with ``θ`` a flat vector."""
    out = functional_call(model, unflatten(theta, like), (x,))
    return per_sample_loss(loss, out, y).mean() + 0.5 * weight_decay * (theta**2).sum()


def solve_inner(model: nn.Module, like: dict[str, torch.Tensor], theta0: torch.Tensor, x: torch.Tensor,
                y: torch.Tensor, loss: str, weight_decay: float, steps: int, tol: float, beta: float | None = None,
                info: dict[str, Any] | None = None, stop: Stop = None) -> tuple[torch.Tensor, float]:
    """Train ``θ`` on ``E(x, ·)`` from ``theta0`` by :func:`exhume.attacks.bilevel.lower_level.newton_cg` until ``‖∇_θE‖ ≤ tol``
    (``steps`` Newton steps at most); returns ``θ`` and ``‖∇_θE‖``.

    ``beta``: ReLUs become ``softplus(β·z)/β`` in the objective (:class:`~exhume.equations.surrogate.smooth_activations`).
    ``info`` (a dict) receives the solver's record. ``stop()``: the time budget is spent; the solver returns the iterate
    so far (``info["stopped"]``), checked every Hessian-vector product.
    """
    x = x.detach()

    def objective(t: torch.Tensor) -> torch.Tensor:
        with smooth_activations(beta):
            return inner_objective(model, like, t, x, y, loss, weight_decay)

    theta, record = newton_cg(objective, theta0, tol, steps, stop=stop)
    if info is not None:
        info.update(record)
    return theta, record["grad_norm"]


def conjugate_gradient(matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, x0: torch.Tensor | None,
                       iterations: int, tol: float, stop: Stop = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Solve ``A p = b`` for symmetric ``A`` given only ``matvec``; stops at ``‖r‖ ≤ tol·‖b‖``.

    Stops early (flagged) on non-positive curvature ``dᵀAd ≤ 0``, where CG is not defined, and
    when ``stop()`` (the time budget is spent; ``"stopped"``).
    """
    p = torch.zeros_like(b) if x0 is None else x0.clone()
    r = b - matvec(p) if x0 is not None else b.clone()
    d = r.clone()
    rr = r @ r
    bnorm = float(b.norm()) or 1.0
    info = {"iterations": 0, "relative_residual": float(rr.sqrt()) / bnorm, "negative_curvature": False, "stopped": False}
    for k in range(iterations):
        if float(rr.sqrt()) <= tol * bnorm:
            break
        if stop is not None and stop():
            info["stopped"] = True
            break
        ad = matvec(d)
        curv = d @ ad
        if not torch.isfinite(curv) or curv <= 1e-14 * float(d @ d):
            info["negative_curvature"] = True
            break
        a = rr / curv
        p = p + a * d
        r = r - a * ad
        rr_new = r @ r
        d = r + (rr_new / rr) * d
        rr = rr_new
        info["iterations"] = k + 1
    info["relative_residual"] = float(rr.sqrt()) / bnorm
    return p, info


def implicit_gradient(model: nn.Module, like: dict[str, torch.Tensor], theta: torch.Tensor, theta_star: torch.Tensor,
                      x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float, damping: float = 0.0,
                      cg_iterations: int = 100, cg_tol: float = 1e-8, p0: torch.Tensor | None = None,
                      alpha: float | None = None, beta: float | None = None,
                      lanczos: int = 20, stop: Stop = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``∇_x l(θ*, θ(x))`` at an inner optimum ``θ``, with ``l = ‖θ* − θ‖²``.

    Returns the gradient (shaped like ``x``), the adjoint ``p`` solving ``(H + δI) p = 2(θ − θ*)``
    and the CG information. One graph of ``∇_θ E(x, θ)`` (built with ``create_graph``) serves
    every Hessian-vector product ``H v = ∇_θ⟨∇_θE, v⟩`` and the final mixed product
    ``∇_x⟨∇_θE, p⟩``. ``alpha`` gives ReLUs the ``sigmoid(α·z)`` derivative in these products;
    ``beta`` makes them ``softplus(β·z)/β`` (the smoothed lower level of :func:`solve_inner`).
    ``damping=None`` picks ``δ`` from the spectrum: ``lanczos`` Lanczos products estimate ``λ_min``,
    ``λ_max`` of ``H`` and :func:`~exhume.attacks.bilevel.lower_level.spectral_damping` lifts ``λ_min`` above 0
    (``δ = 0`` when ``H`` is positive definite). ``stop()`` ends the Lanczos and CG iterations early
    (``info["stopped"]``: the caller abandons the gradient).
    """
    x = x.detach().requires_grad_()
    t = theta.detach().clone().requires_grad_()
    with soft_activations(alpha), smooth_activations(beta):
        (g,) = torch.autograd.grad(inner_objective(model, like, t, x, y, loss, weight_decay), t, create_graph=True)

    def h(v: torch.Tensor) -> torch.Tensor:
        (hv,) = torch.autograd.grad(g, t, grad_outputs=v, retain_graph=True)
        return hv

    spectrum: dict[str, Any] = {}
    if damping is None:
        lam_min, lam_max = extreme_eigenvalues(h, t.numel(), t.detach(), lanczos, stop=stop)
        damping = spectral_damping(lam_min, lam_max)
        spectrum = {"lambda_min": lam_min, "lambda_max": lam_max}
    delta = float(damping)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        return h(v) + delta * v

    b = 2.0 * (theta.detach() - theta_star)
    p, info = conjugate_gradient(hvp, b, p0, cg_iterations, cg_tol, stop)
    info.update(spectrum, damping=delta)
    (mixed,) = torch.autograd.grad(g, x, grad_outputs=p.detach())
    return -mixed.detach(), p.detach(), info



#: with a deadline, the final lower-level solve gets what is left of it, at least this share of the run's seconds
FINAL_SHARE = 0.1
#: copies of the parameters, of each candidate and of each candidate's activations at the peak (measured)
BILEVEL_MEMORY = (50.0, 1.0, 8.0)


@dataclass
class Problem:
    """The attack's working copy of the victim, its settings and its unknowns (centred candidates ``x``)."""

    model: nn.Module
    like: dict[str, torch.Tensor]
    theta_star: torch.Tensor
    theta_sq: float
    wd: float
    loss: str
    n: int
    m: int
    mean: torch.Tensor
    y: torch.Tensor
    x: torch.Tensor
    state: dict[str, torch.Tensor]  # "theta": the warm-started inner solution, "p": the last adjoint


@register
class BilevelAttack(Attack):
    """Bilevel reconstruction ``min_x̂ ‖θ* − θ(x̂)‖²`` with implicit gradients (binary tasks)."""

    name = "bilevel"
    # θ* must be the minimiser of the training objective the lower level solves: a stationary point of it
    equation = Stationarity(text="θ* = argmin_θ mean_i ℓ(Φ(θ; x_i), y_i) + (w/2)‖θ‖²: a stationary point of the training objective")
    params = {
        "m": Param(None, int, "number of candidates (default: n_guess, else the init's size)", low=2, allow_none=True),
        **CANDIDATE_PARAMS,
        # two candidates at least (one per label) when m defaults to n_guess
        "n_guess": Param(None, int, "attacker's guess of n (default from the victim's metadata, else 100)", low=2, allow_none=True),
        **budget_params(200, unit="outer steps on x̂"),
        "dtype": Param("float64", str, "computation precision (float64: the lower level is solved to 1e-9)",
                       choices=tuple(DTYPES)),
        "damping": Param(None, float, "δ added to the Hessian in the CG solve (None: from the spectrum, "
                         "0 when H is positive definite; 0: exact implicit gradient)", low=0.0, allow_none=True),
        "inner_steps": Param(100, int, "at most this many damped Newton-CG iterations of inner training per outer step "
                             "(they stop at inner_tol; docs/defaults.md#bilevel-inner_steps)", low=1),
        "inner_tol": Param(1e-9, float, "stop inner training at ‖∇_θ E‖ below this", low=0.0),
        "smooth": Param(100.0, float, "lower level on softplus(β·z)/β instead of ReLU (value and derivatives), "
                        "so that it has a stationary point; None: exact activations", low=0.0, allow_none=True),
        "cg_iterations": Param(100, int, "conjugate-gradient iterations per outer step", low=1),
        "cg_tol": Param(1e-6, float, "CG stops at ‖r‖ ≤ cg_tol·‖b‖", low=0.0),
        "theta_init": Param("victim", str, "first inner start: the victim's θ* or U(0,1) weights (the paper's)",
                            choices=("victim", "uniform")),
        "project": Param(True, bool, "project x̂ + mean onto [0, 1] after each step"),
        "alpha": Param(None, float, "ReLU surrogate derivative sigmoid(α·z) in H and the mixed term (None: exact)",
                       low=0.0, allow_none=True),
    }

    #: the lower level's L-BFGS, gone (it stalls where Newton-CG converges: research/README.md, "What left the package"),
    #: at the value a checkpoint of a run that did what every run does now recorded (Attack.retired)
    retired = {"inner_solver": ("newton-cg",)}
    checkpoint_every, log_every = 20, 5
    memory_knobs = {"m": "count", "dtype": "dtype"}

    def effective(self, view, name: str) -> Any:
        if name == "m":
            return self.config["m"] or self.config["n_guess"] or view.n_train_hint or 100
        return super().effective(view, name)

    def peak_memory_bytes(self, view) -> int:
        """Peak bytes: the Lanczos bases and conjugate-gradient vectors of the lower level are parameter-sized
        (``BILEVEL_PER_PARAMETER·P·b``), the graph of ``∇_θE`` over ``m`` candidates holds their activations, and the
        candidates their copies (coefficients measured, ``benchmarks/memory_estimate.py``)."""
        from exhume.attacks.engine import memory as mem

        b, m = mem.dtype_bytes(self.config["dtype"]), self.effective(view, "m")
        p, d = mem.parameter_count(view.model), mem.input_elements(view)
        a = mem.activation_elements(view.model, tuple(view.input_shape))
        per_p, per_d, per_a = BILEVEL_MEMORY
        return int(mem.BASE_BYTES + b * (per_p * p + per_d * m * d + per_a * (m * a.per_input + a.fixed)))
    def candidate_count(self, n: int) -> int:
        return int(self.config["m"] or self.config["n_guess"] or n)

    def check(self, view) -> None:
        if view.task != "binary":
            raise ConfigError(f"the bilevel attack handles binary tasks here; the victim's task is {view.task!r}")
        if not view.weight_decay and not self.config["damping"]:
            raise ConfigError("the bilevel attack needs the victim's weight decay > 0 (unknown or 0 here) or damping > 0, "
                              "so that the inner Hessian is invertible; state it (--weight-decay W, weight_decay=) or pass "
                              "-p damping=...")

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 10, init: torch.Tensor | None = None,
            init_name: str = "noise", deadline: Deadline = NEVER, checkpoint_every: int | None = None,
            log_every: int | None = None, owner=None) -> Reconstruction:
        """Run the attack on ``view`` (an :class:`~exhume.victim.AttackerView`).

        Same protocol as :meth:`exhume.attacks.kkt.KKTAttack.run`: ``out`` for checkpoints,
        ``resume``, ``callback(step, seconds, candidates)`` every ``callback_every`` outer steps,
        ``init`` display-space starting images (default U(0,1) noise, the paper's), ``init_name``, ``deadline``,
        ``checkpoint_every``, ``log_every`` and ``owner``.
        """
        self.check(view)
        cfg, every = self.config, self.cadence(checkpoint_every, log_every)
        p = self.problem(view, torch.device(device), seed, init)
        opt = make_optimizer(cfg["optimizer"], [p.x], cfg["lr"])
        run = open_run(out, resume, {"x": p.x, **p.state}, {"opt": opt},
                       {"config": resumable_settings(cfg), "seed": seed, "m": p.m}, snapshot=lambda: {"x": p.x, **p.state},
                       defaults=self.defaults(), retired=self.retired_on(view), owner=owner)
        self.project(p)
        step = self.stepper(p, opt, run.history, cold=run.start == 0, deadline=deadline)  # a resumed run's θ is its checkpoint's

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                callback(it, elapsed, (p.x + p.mean).float().cpu())

        end = attack_loop("bilevel attack", cfg["iterations"], run, step, deadline, every, progress=progress,
                          emit=None if callback is None else emit, emit_every=callback_every)
        final = NEVER if not deadline.bounded else deadline.at_least(FINAL_SHARE * deadline.seconds)
        return self.result(p, end, run, seed, init_name, final)

    def problem(self, view, dev: torch.device, seed: int, init: torch.Tensor | None) -> Problem:
        cfg = self.config
        wd = float(view.weight_decay or 0.0)
        dtype = DTYPES[cfg["dtype"]]
        model, like = attack_model(view.model, dev, dtype)
        theta_star = flatten(like)
        n = cfg["n_guess"] or view.n_train_hint or 100
        m = cfg["m"] or (init.shape[0] if init is not None else n)
        gen = torch.Generator().manual_seed(seed)
        if init is None:
            x0 = torch.rand(m, *view.input_shape, generator=gen, dtype=dtype) - view.mean.to(dtype)
        else:
            x0 = initial_candidates(init, m, view.input_shape, view.mean, 0.0, gen, dtype)
        if cfg["theta_init"] == "victim":
            theta = theta_star.clone()
        else:
            theta = torch.rand(theta_star.shape, generator=gen, dtype=dtype).to(dev)
        return Problem(model, like, theta_star, float((theta_star**2).sum()), wd, view.loss or "logistic", n, m,
                       view.mean.to(dev, dtype), binary_labels(m, dtype).to(dev), x0.to(dev).requires_grad_(),
                       {"theta": theta, "p": torch.zeros_like(theta_star)})

    def project(self, p: Problem) -> None:
        if self.config["project"]:
            project_range(p.x, -p.mean, 1.0 - p.mean)

    def stepper(self, p: Problem, opt: torch.optim.Optimizer, history: list[dict[str, Any]], cold: bool = True,
                deadline: Deadline = NEVER):
        """One outer step: inner training, adjoint solve, implicit gradient, optimiser step, projection (abandoned when
        ``deadline`` passes inside it)."""
        cfg = self.config

        first = [cold]  # the first solve of a run from its start is not warm-started: give it more Newton steps

        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            inner: dict[str, Any] = {}
            steps = cfg["inner_steps"] * (4 if first[0] else 1)
            spent = budget_spent(deadline)
            theta, inner_grad = solve_inner(p.model, p.like, p.state["theta"], p.x, p.y, p.loss, p.wd, steps, cfg["inner_tol"],
                                            cfg["smooth"], inner, stop=spent)
            dist = float(((theta - p.theta_star) ** 2).sum())
            if not torch.isfinite(theta).all():
                raise DivergenceError(f"bilevel inner training diverged at outer step {it}; raise weight_decay or damping")
            gx, adjoint, cg = implicit_gradient(p.model, p.like, theta, p.theta_star, p.x, p.y, p.loss, p.wd, cfg["damping"],
                                                cfg["cg_iterations"], cfg["cg_tol"], p.state["p"], cfg["alpha"], cfg["smooth"],
                                                stop=spent)
            if spent is not None and spent():  # the budget ran out inside this step: abandon it, state untouched
                raise BudgetSpent
            first[0] = False
            p.state["theta"], p.state["p"] = theta, adjoint
            if not torch.isfinite(gx).all():
                raise DivergenceError(f"bilevel implicit gradient is not finite at outer step {it}; raise damping")
            opt.zero_grad(set_to_none=True)
            p.x.grad = gx
            opt.step()
            self.project(p)
            if not log:
                return None
            history.append({"iteration": it, "param_distance": dist, "relative_param_distance": dist / p.theta_sq,
                            "inner_grad_norm": inner_grad, "inner_iterations": inner.get("iterations"),
                            "damping": cg["damping"], "lambda_min": cg.get("lambda_min"), "cg_iterations": cg["iterations"],
                            "cg_relative_residual": cg["relative_residual"],
                            "negative_curvature": cg["negative_curvature"], "seconds": round(clock(), 3)})
            return {"dist": f"{dist:.3g}"}

        return step

    def result(self, p: Problem, end, run: RunState, seed: int, init_name: str, deadline: Deadline = NEVER) -> Reconstruction:
        """θ after solving: train once more on the final candidates (until ``deadline``) and measure the distance to θ*."""
        cfg = self.config
        final: dict[str, Any] = {}
        theta_final, inner_grad = solve_inner(p.model, p.like, p.state["theta"], p.x, p.y, p.loss, p.wd,
                                              max(cfg["inner_steps"], 100), cfg["inner_tol"], cfg["smooth"], final,
                                              stop=budget_spent(deadline))
        dist = float(((theta_final - p.theta_star) ** 2).sum())
        with torch.no_grad():
            out_final = functional_call(p.model, unflatten(theta_final, p.like), (p.x,))
            candidates = (p.x + p.mean).float().cpu()
        negative = sum(1 for h in run.history if h.get("negative_curvature"))
        return Reconstruction(
            method=self.name,
            candidates=candidates,
            labels=p.y.float().cpu(),
            scores=(p.y * out_final).detach().float().cpu(),
            record=RunRecord(
                iterations=end.done, seconds=round(end.elapsed, 3), init=init_name,
                settings={**cfg, "m": p.m, "n_guess": p.n, "weight_decay_used": p.wd, "loss_used": p.loss},
                extras={"param_distance": dist, "relative_param_distance": dist / p.theta_sq,
                        "param_distance_note": "‖θ* − θ‖² with θ trained on the final candidates (warm-started lower-level solve)",
                        "final_inner_grad_norm": inner_grad, "final_inner_stopped_by_budget": bool(final.get("stopped")),
                        "logged_steps_with_negative_curvature": negative,
                        "scores_note": "margins y·Φ(x̂; θ) of the candidates under θ trained on them"}),
            seed=seed,
            loss_history=run.history,
        )
