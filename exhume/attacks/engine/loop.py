"""The optimisation-run skeleton every attack shares, so that an attack's ``run()`` is its maths.

* :func:`budget_params`: the attack's step budget (its number of steps), merged into each attack's ``params``;
* :func:`make_optimizer`: Adam or SGD with momentum (:data:`SGD_MOMENTUM`), built the same way everywhere;
* :func:`open_run`: the checkpoint file in ``out``, restored in place on ``resume`` (with the
  settings a resumed run must share), and saved by :meth:`RunState.save`;
* :func:`attack_loop` / :func:`run_loop`: progress, the deadline, logging cadence, checkpoints
  (every K steps, on Ctrl-C and at the end) and a user callback whose time is not counted as the attack's.

An attack supplies ``step(it, log, clock)``, which performs iteration ``it``, appends its own
history record when ``log`` is true (``clock()`` gives the attack seconds so far) and returns the
progress-bar postfix (or None); a step long enough to overrun the deadline checks it inside
(:func:`budget_spent`) and raises :class:`BudgetSpent` to be abandoned; ``save(done, elapsed)`` writes a checkpoint;
``emit(it, elapsed)`` calls the user's callback. The loop stops at its step budget or once its
:class:`~exhume.deadline.Deadline` (given by the caller, :meth:`Attack.run`'s ``deadline``) has passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exhume.attacks.engine.base import DTYPES, Param
from exhume.attacks.engine.checkpoint import RunOwner, load_checkpoint, save_checkpoint
from exhume.choices import STEP_OPTIMIZERS
from exhume.deadline import Deadline
from exhume.heap import retained_heap
from exhume.interrupts import whole_step
from exhume.progress import Progress

#: SGD's momentum (optimizer="sgd"): the reference implementation's (docs/METHODS.md §1)
SGD_MOMENTUM = 0.9

# the parameters of the attacks that optimise candidate images directly (kkt, bilevel)
CANDIDATE_PARAMS: dict[str, Param] = {
    "n_guess": Param(None, int, "attacker's guess of n (default from the victim's metadata, else 100)", low=1, allow_none=True),
    "lr": Param(1e-2, float, "learning rate for the candidates x̂", low=0.0),
    "optimizer": Param("adam", str, "optimiser of the candidates (and of kkt's multipliers)", choices=STEP_OPTIMIZERS),
    "dtype": Param("float32", str, "computation precision", choices=tuple(DTYPES)),
}

#: settings :data:`CANDIDATE_PARAMS` no longer has, with the values a checkpoint may have recorded (Attack.retired; its
#: weight_decay is the view's now: Attack.retired_on)
RETIRED_CANDIDATE_SETTINGS: dict[str, tuple[Any, ...]] = {"momentum": (SGD_MOMENTUM,)}

#: the output's soft threshold, as kkt and simulate declare it
BACKGROUND = Param("auto", float, "soft threshold τ on the returned candidates, v ← max(v − τ, 0)/(1 − τ) in "
                   "display space (a number in [0, 0.5]), or 'auto': 0.03 where the data mean shows a dark "
                   "background, else 0 (see exhume/attacks/engine/priors.py: background_level); output only, the "
                   "optimisation is the same", low=0.0, high=0.5, words=("auto",))


def budget_params(total: int, name: str = "iterations", unit: str = "optimisation steps") -> dict[str, Param]:
    """The attack's step budget ``name`` (its number of steps, default ``total``); its seconds are the run's deadline."""
    return {name: Param(total, int, unit, low=1)}


def make_optimizer(kind: str, params: Iterable[torch.Tensor], lr: float, momentum: float = SGD_MOMENTUM,
                   betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Optimizer:
    """``"adam"`` (with ``betas``) or ``"sgd"`` (with ``momentum``) over ``params``."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    return torch.optim.Adam(params, lr=lr, betas=betas)


@dataclass
class RunState:
    """Where a run checkpoints, what it has done so far, and how to save it again."""

    path: Path | None
    snapshot: Callable[[], dict[str, torch.Tensor]]  # the tensors to save, taken at save time
    optimizers: dict[str, torch.optim.Optimizer]
    tag: dict[str, Any]  # settings a resumed run must share with its checkpoint
    start: int = 0
    elapsed: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    owner: RunOwner | None = None  # stamped on its checkpoints (exhume.attacks.engine.checkpoint)

    def save(self, done: int, elapsed: float) -> None:
        if self.path is not None:
            save_checkpoint(self.path, self.snapshot(), self.optimizers,
                            {"iteration": done, "elapsed": elapsed, "history": self.history, **self.tag}, self.owner)


def open_run(out: str | Path | None, resume: bool, tensors: dict[str, torch.Tensor],
             optimizers: dict[str, torch.optim.Optimizer], tag: dict[str, Any],
             snapshot: Callable[[], dict[str, torch.Tensor]] | None = None, defaults: dict[str, Any] | None = None,
             retired: dict[str, tuple[Any, ...]] | None = None, owner: RunOwner | None = None) -> RunState:
    """The run's checkpoint ``out/checkpoint.pt``; with ``resume`` and an existing checkpoint,
    ``tensors`` and ``optimizers`` are restored in place and its progress is picked up (its
    ``tag`` settings must equal this run's; a setting the checkpoint predates counts as its value in
    ``defaults``, the attack's setting defaults; one the attack no longer has must hold a value ``retired``, or
    :data:`RETIRED_CANDIDATE_SETTINGS`, accepts). ``snapshot`` gives the tensors to save (default: ``tensors`` as they are
    then); ``owner``: whose run it is (:class:`~exhume.attacks.engine.checkpoint.RunOwner`, given to :meth:`Attack.run`)."""
    path = Path(out) / "checkpoint.pt" if out is not None else None
    run = RunState(path, snapshot or (lambda: tensors), optimizers, tag, owner=owner)
    if resume and path is not None and path.exists():
        state = load_checkpoint(path, tensors, optimizers, expect=tag, defaults=defaults,
                                retired={**RETIRED_CANDIDATE_SETTINGS, **(retired or {})}, owner=owner)
        run.start, run.elapsed, run.history = state["iteration"], state["elapsed"], state["history"]
    return run


def attack_loop(desc: str, total: int, run: RunState, step: Callable[[int, bool, Callable[[], float]], dict[str, str] | None],
                deadline: Deadline, every: tuple[int, int], *, progress: bool = True,
                emit: Callable[[int, float], None] | None = None, emit_every: int = 1000) -> LoopEnd:
    """:func:`run_loop` of ``total`` steps to ``deadline``, checkpointing and logging ``every`` ``(checkpoint_every,
    log_every)`` steps into ``run``, freed memory kept in the process meanwhile (:func:`exhume.heap.retained_heap`: no
    page faults on reuse)."""
    with retained_heap():
        return run_loop(desc, total, deadline, run.start, run.elapsed, step, run.save, checkpoint_every=every[0],
                        log_every=every[1], progress=progress, emit=emit, emit_every=emit_every)


class BudgetSpent(Exception):
    """Raised by a step that its deadline passed inside: the step is abandoned (its state untouched)."""


def budget_spent(deadline: Deadline) -> Callable[[], bool] | None:
    """``stop()`` for the solvers inside a long step: true once ``deadline`` has passed (None: it never does)."""
    return deadline.passed if deadline.bounded else None


@dataclass
class LoopEnd:
    done: int  # the last iteration whose update is complete
    elapsed: float  # attack seconds, callbacks excluded, resumed runs included


def run_loop(desc: str, total: int, deadline: Deadline, start: int, elapsed0: float,
             step: Callable[[int, bool, Callable[[], float]], dict[str, str] | None],
             save: Callable[[int, float], None], *, log_every: int, checkpoint_every: int, progress: bool = True,
             emit: Callable[[int, float], None] | None = None, emit_every: int = 1000) -> LoopEnd:
    """Steps ``start + 1`` to ``total``, stopped after the first that ends past ``deadline``; checkpointed every
    ``checkpoint_every``, on Ctrl-C and at the end. The callback's seconds are the caller's: neither in the attack's
    ``elapsed`` nor charged to the deadline, which moves later by them."""
    t0 = time.perf_counter()
    paused = 0.0

    def clock() -> float:
        return elapsed0 + time.perf_counter() - t0 - paused

    done = last_saved = start
    left = deadline.left()
    bar = Progress(desc, total, None if left is None else elapsed0 + left, start, elapsed0, disable=not progress)
    try:
        for it in range(start + 1, total + 1):
            log = it % log_every == 0 or it == 1
            with whole_step():  # an interrupt lands before or after the update and its count, never between
                postfix = step(it, log, clock)
                done = it
            elapsed = clock()
            bar.update(it, **(postfix or {}))
            if it % checkpoint_every == 0:
                save(done, elapsed)
                last_saved = done
            if emit is not None and it % emit_every == 0:
                pause = time.perf_counter()
                emit(it, elapsed)
                pause = time.perf_counter() - pause
                paused, deadline = paused + pause, deadline.later(pause)
            if deadline.passed():
                break
    except BudgetSpent:
        pass  # the step the deadline passed in was abandoned: `done` is the last complete one
    except KeyboardInterrupt:
        save(done, clock())  # an interrupted run loses nothing: --resume continues from here
        raise
    finally:
        bar.close()
    if done != last_saved:  # the last periodic checkpoint may already be the final one
        save(done, clock())
    return LoopEnd(done=done, elapsed=clock())


def descend(loss: torch.Tensor, opts, span=None, x: torch.Tensor | None = None) -> None:
    """One step of every optimiser in ``opts`` on ``loss``; then the candidates ``x`` projected onto ``span``'s basis (if any)."""
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    for opt in opts:
        opt.step()
    if span is not None and span.basis is not None:
        with torch.no_grad():
            x.copy_(span.project(x))
