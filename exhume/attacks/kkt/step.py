"""kkt's one step, written once for a lone run and for each restart of a batched (vmapped) group.

:meth:`Step.__call__` is a lone run's iteration: the loss terms (:mod:`exhume.attacks.kkt.terms`) and their gradients
by one backward pass, then :meth:`Step.advance`. :mod:`exhume.portfolio.batched` evaluates the terms and gradients of
every restart at once (``torch.func.vmap``) and calls :meth:`Step.advance` of each restart with its own. ``advance`` is
the rest of the step: the divergence check, the closed-form multipliers, every optimiser's step, the projection onto
the span, the averaged iterate and its snapshot, the history record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exhume.attacks.engine.snapshots import IterateTracker
from exhume.attacks.kkt import settings
from exhume.attacks.kkt.problem import Problem
from exhume.attacks.kkt.terms import criterion, solved_u, terms
from exhume.equations.stationarity import TracedResidual
from exhume.errors import DivergenceError


def stationarity_for(cfg: dict[str, Any], p: Problem, trace: bool | None = None, seconds: float | None = None) -> TracedResidual | None:
    """The traced stationarity function a lone run's steps replay, or None (eager); why goes to the result's config.
    ``trace``: True or False forces it (tests, benchmarks), None leaves it to :func:`~exhume.attacks.kkt.settings.traces`
    with the run's deadline's ``seconds``."""
    why = ("the known-start equation" if p.eq is not None else "closed-form multipliers" if p.closed
           else "asked for (trace=False)" if trace is False else None)
    if why is None and trace is None and not settings.traces(cfg["iterations"], seconds):
        why = (f"a budget under {settings.TRACE_MIN_SECONDS:g} s" if seconds
               else f"fewer than {settings.TRACE_MIN_ITERATIONS} iterations") + " (tracing would not be won back)"
    if why is None:
        return TracedResidual(p.form.info)
    p.form.info.update(residual_traced=False, residual_trace_note=f"eager: {why}")
    return None


class Step:
    """One optimisation step of kkt on ``p``, appending its record to ``history`` when logging.

    ``opts``: the optimisers of ``x`` and ``u`` (``u``'s is left out with closed-form multipliers); ``tracker``: the
    averaged iterate and its snapshots; ``stationarity``: what :func:`stationarity_for` chose (a lone run's)."""

    def __init__(self, cfg: dict[str, Any], p: Problem, opts: Sequence[torch.optim.Optimizer], tracker: IterateTracker,
                 history: list[dict[str, Any]], stationarity: TracedResidual | None = None) -> None:
        self.cfg, self.p, self.tracker, self.history, self.stationarity = cfg, p, tracker, history, stationarity
        self.opts = tuple(opts[:1] if p.closed else opts)
        self.score = criterion(cfg, p)

    def __call__(self, it: int, log: bool, clock: Callable[[], float]) -> dict[str, str] | None:
        """Iteration ``it`` of a lone run; the progress bar's postfix when logging."""
        p = self.p
        t = terms(self.cfg, p, p.x, p.u, self.stationarity)
        if not torch.isfinite(t.loss):
            self.diverged(it, float(t.loss.detach()))
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        t.loss.backward()
        rec = self.advance(it, log, clock, t[:4], t.lam, checked=True)
        return None if rec is None else {"stat": f"{rec['stationarity']:.3g}"}

    def diverged(self, it: int, loss: float) -> None:
        raise DivergenceError(f"kkt attack diverged at iteration {it} (loss {loss}); lower lr (now {self.cfg['lr']})")

    def advance(self, it: int, log: bool, clock: Callable[[], float], values: Sequence[Any], lam: torch.Tensor | None = None,
                checked: bool = False) -> dict[str, Any] | None:
        """The step once the gradients of ``x`` (and ``u``) are set: ``values`` are the four terms (loss, stationarity,
        dual, prior; tensors or numbers) at the iterate they were taken at, ``lam`` the closed-form multipliers there.
        Raises :class:`DivergenceError` on a non-finite loss (``checked``: the caller has checked), before any update."""
        p = self.p
        if not checked and not math.isfinite(float(values[0])):
            self.diverged(it, float(values[0]))
        if lam is not None:
            with torch.no_grad():
                p.u.copy_(solved_u(p, lam))
        for opt in self.opts:
            opt.step()
        if p.span.basis is not None:
            with torch.no_grad():
                p.x.copy_(p.span.project(p.x))
        self.tracker.update({"x": p.x, "u": p.u})
        if it % settings.SNAPSHOT_EVERY == 0:
            self.tracker.consider(it, self.score)
        if not log:
            return None
        loss, stat, dual, prior = (float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for v in values)
        rec = {"iteration": it, "loss": loss, "stationarity": stat, "dual": dual, "prior": prior, "seconds": round(clock(), 3)}
        self.history.append(rec)
        return rec

    def close(self, done: int) -> None:
        """At the end of a run (``done`` iterations): the last averaged iterate is a snapshot too, unless it was just taken."""
        if self.tracker.best_iteration != done:
            self.tracker.consider(done, self.score)
