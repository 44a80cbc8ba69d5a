"""Levenberg–Marquardt on the exact training run, for small problems (``solver="lm"`` of the ``simulate`` attack).

The residual is the run's miss, ``r(x̂) = (Run(θ_0; x̂, q) − θ_T) / ‖θ_T − θ_0‖`` (its square norm is the relative
gap of :func:`exhume.equations.exact.relative_gap`), and its Jacobian in the candidates is formed whole by forward mode
(``torch.func.jacfwd`` through the unrolled run, :func:`run_flat`: all columns in one vectorised pass). Each iteration
solves ``(JᵀJ + λ·diag JᵀJ) δ = −Jᵀr`` and keeps the step only if the gap falls (λ ÷ 3), else raises λ (× 4) and
tries again. It fits where the parameters outnumber the unknowns (``p ≥ m·d``) and ``p × m·d`` doubles fit in memory.

ReLU networks: the run is replayed exactly, but ReLU's step has derivative 0, so the Jacobian does not see the
activation patterns move. The solver therefore goes through ``schedule``: stages with the step's derivative smoothed
to ``α·σ'(α·z)`` (:class:`exhume.equations.exact.smoothed_step`), small ``α`` first (a smooth, global picture), then
sharper, then a polish with the exact derivative, ``stage_iterations`` each (fewer when a stage stalls). A finished
schedule that leaves the gap above ``tol`` restarts from new noise; the candidates with the smallest gap are kept
(attacker-side: the gap needs no training data). The labels are fixed one-hot (the candidates' classes, or the user's
in the training set's order). A resumed run starts
the schedule again from the saved candidates (the solver's λ, stage and best are not checkpointed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import grad, jacfwd

from exhume.attacks.engine.loop import BudgetSpent
from exhume.equations.exact import Replay, batch_loss
from exhume.equations.recipe import init_state, update
from exhume.errors import ConfigError, DivergenceError

#: a gap below this ends the search (the training images give 1e-31 in float64)
TOL = 1e-20
#: the largest Jacobian solver='lm' forms
JACOBIAN_BYTES = 2 << 30


def run_flat(r: Replay, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``θ_T`` over ``r.names``, flat, after the whole run on candidates ``x`` with labels ``q``, written with torch.func
    (no checkpoint: meant for tiny runs under ``jacfwd``)."""
    theta = dict(r.start)
    state = init_state(r.settings, theta)
    for t, idx in enumerate(r.order):
        xb, qb = x[idx], q[idx]
        g = grad(lambda th, xb=xb, qb=qb: batch_loss(r, th, xb, qb))(theta)
        theta, state = update(r.settings, theta, g, state, t + 1)
    return torch.cat([theta[k].reshape(-1) for k in r.names])


@dataclass
class ExactLM:
    """The solver's state between iterations (one iteration: one Jacobian); :meth:`step` moves ``x`` in place."""

    replay: Replay
    final: torch.Tensor  # θ_T over the replay's names, flat
    q: torch.Tensor  # the labels, one-hot (binary: the probability of +1, 0 or 1)
    schedule: tuple[float | None, ...]  # the stages' α (None: the exact derivative)
    stage_iterations: int
    init_scale: float
    gen: torch.Generator
    stage: int = 0
    done_in_stage: int = 0
    lam: float = 1e-2
    restart: int = 0
    gap: float = math.inf
    best: tuple[torch.Tensor, torch.Tensor, float] | None = None
    finished: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        start = torch.cat([self.replay.start[k].reshape(-1) for k in self.replay.names])
        self.den = max(float((self.final - start).norm()), 1e-300)

    def residual(self, x: torch.Tensor, alpha: float | None) -> torch.Tensor:
        r = dataclasses.replace(self.replay, alpha=alpha)
        return (run_flat(r, x, self.q) - self.final) / self.den

    def step(self, x: torch.Tensor) -> dict[str, Any]:
        """One LM iteration on ``x`` (in place) at the current stage; then the schedule moves on where it should."""
        if self.finished:
            return {"gap": self.best[2], "alpha": None, "restart": self.restart, "stage": self.stage}
        alpha = self.schedule[self.stage]
        with torch.no_grad():
            if math.isinf(self.gap):
                self.gap = float(self.residual(x.detach(), alpha).square().sum())
            moved = self._iterate(x, alpha)
        self.done_in_stage += 1
        out = {"gap": self.gap, "alpha": alpha, "restart": self.restart, "stage": self.stage}
        if not moved or self.done_in_stage >= self.stage_iterations or self.gap < TOL:
            self._next_stage(x)
        return out

    def _iterate(self, x: torch.Tensor, alpha: float | None) -> bool:
        shape = x.shape
        flat = x.detach().reshape(-1)

        def fun(v: torch.Tensor) -> torch.Tensor:
            return self.residual(v.reshape(shape), alpha)

        jac = jacfwd(fun)(flat)
        res = fun(flat)
        a, b = jac.T @ jac, jac.T @ res
        diag = torch.diag(torch.diag(a).clamp_min(1e-12 * float(torch.diag(a).max().clamp_min(1e-300))))
        while self.lam < 1e8:
            delta = torch.linalg.solve(a + self.lam * diag, -b)
            trial = float(fun(flat + delta).square().sum())
            if math.isfinite(trial) and trial < self.gap:
                x.copy_((flat + delta).reshape(shape))
                self.gap, self.lam = trial, max(self.lam / 3, 1e-9)
                return True
            self.lam *= 4
        return False

    def _next_stage(self, x: torch.Tensor) -> None:
        self.stage, self.done_in_stage, self.lam = self.stage + 1, 0, 1e-2
        if self.stage < len(self.schedule) and self.gap >= TOL:
            self.gap = math.inf  # the next stage's α is another function of x: re-evaluated (the value is the same)
            return
        if self.best is None or self.gap < self.best[2]:
            self.best = (x.detach().clone(), self.q.clone(), self.gap)
        if self.best[2] < TOL:
            self.finished = True
            return
        self.restart += 1
        with torch.no_grad():
            x.copy_(torch.randn(x.shape, generator=self.gen, dtype=x.dtype).to(x.device) * self.init_scale)
        self.stage, self.gap = 0, math.inf

    def best_gap(self) -> float:
        """The relative gap of what :meth:`finish` returns (one-hot labels)."""
        if self.best is not None and (self.finished or not self.gap < self.best[2]):
            return self.best[2]
        return self.gap

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The candidates with the smallest gap seen (the best finished schedule, or ``x`` where the budget ended a better
        one early) into ``x``, in place; their labels returned."""
        if self.best is not None and (self.finished or not self.gap < self.best[2]):
            with torch.no_grad():
                x.copy_(self.best[0])
            return self.best[1]
        return self.q


def one_hot(task: str, classes: torch.Tensor, k: int) -> torch.Tensor:
    """Class ids (binary: ±1 or 0/1) as the replay's labels: binary the probability of +1; multiclass one-hot rows."""
    if task == "binary":
        return (classes > 0).double()
    return torch.nn.functional.one_hot(classes.long(), k).double()


def parse_labels(spec: str, task: str, n: int, k: int) -> torch.Tensor | None:
    """``labels``: ``"fixed"`` → None (the candidates' own classes), else
    ``n`` comma-separated class ids in the training set's order, checked (one :class:`ConfigError` line)."""
    if spec == "fixed":
        return None
    try:
        ids = [int(v) for v in spec.split(",")]
    except ValueError:
        raise ConfigError(f"labels must be 'fixed' or {n} comma-separated class ids, got {spec!r}") from None
    valid = (0, 1, -1) if task == "binary" else tuple(range(k))
    if len(ids) != n or any(v not in valid for v in ids):
        raise ConfigError(f"labels must list {n} class ids in {valid[0]}…{valid[-1]} (the training set's order), got {spec!r}")
    return torch.tensor(ids)


def parse_schedule(spec: str) -> tuple[float | None, ...]:
    """``schedule``: the stages' α, comma-separated (positive numbers), then the exact polish (α None)."""
    try:
        alphas = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        alphas = [-1.0]
    if any(not (a > 0 and math.isfinite(a)) for a in alphas):
        raise ConfigError(f"schedule must be positive smoothing α values, comma-separated (e.g. '1,3,10,30'), got {spec!r}")
    return (*alphas, None)


def replay_logits(task: str, q: torch.Tensor) -> torch.Tensor:
    """The attack's label logits for replay labels ``q``: ±30, one-hot to rounding (σ(30) = 1 − 9e-14)."""
    return 30.0 * (2 * q - 1) if task == "binary" else 30.0 * q


def check_lm(cfg: dict[str, Any], view, n: int) -> None:
    """Refuse, in one line, the exact run's settings it cannot honour: bad labels or schedule; for ``solver="lm"`` a
    Jacobian too large."""
    parse_schedule(cfg["schedule"])
    parse_labels(cfg["labels"], view.task, n, int(view.num_classes or 2))
    if cfg["solver"] != "lm":
        return
    p = sum(v.numel() for v in view.model.parameters())
    unknowns = n * math.prod(view.input_shape)
    size = p * unknowns * (8 if cfg["dtype"] == "float64" else 4)
    if size > JACOBIAN_BYTES:
        raise ConfigError(f"solver 'lm' forms the run's whole Jacobian: {p} parameters × {unknowns} unknowns = "
                          f"{size / 2**30:.1f} GiB > {JACOBIAN_BYTES / 2**30:.0f} GiB; use solver='adam'")


def lm_stepper(p, lm: ExactLM, history: list[dict[str, Any]]):
    """The attack loop's step for :class:`ExactLM` on the problem ``p`` of :mod:`exhume.attacks.replay.simulate`."""
    def step(it: int, log: bool, clock) -> dict[str, str] | None:
        if lm.finished:
            raise BudgetSpent  # the gap is at rounding: nothing left to do (the loop ends at the previous iteration)
        info = lm.step(p.x)
        if not math.isfinite(info["gap"]):
            raise DivergenceError(f"the exact run's Levenberg–Marquardt solver met a non-finite gap at iteration {it}")
        if not log:
            return None
        history.append({"iteration": it, "loss": info["gap"], "unexplained": info["gap"], "prior": 0.0,
                        "seconds": round(clock(), 3), "alpha": info["alpha"], "restart": info["restart"]})
        return {"left": f"{info['gap']:.3g}"}

    return step
