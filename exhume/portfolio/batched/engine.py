"""The batched restarts' engine: one problem per restart, every restart's loss terms in one ``torch.func.vmap`` call
(eager in a short run, else traced once: :func:`evaluate`), then each restart's own step (``kkt.Step.advance``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from exhume.attacks.kkt import traces
from exhume.deadline import NEVER, Deadline
from exhume.equations.stationarity import traced
from exhume.errors import DivergenceError
from exhume.portfolio.plan import Restart

#: make_fx's mode: real tensors (fake ones gave a graph whose replay failed on a view under vmap)
TRACING_MODE = "real"


class NotBatchable(Exception):
    """This group cannot run batched (the reason is the message): it runs the usual way."""


@dataclass
class Member:
    """One restart inside a batch: the single run's problem, step (optimisers, averaged iterates) and checkpoint."""

    restart: Restart
    attack: Any
    problem: Any
    step: Any  # exhume.attacks.kkt.Step
    run: Any
    error: str | None = None


@dataclass
class Batch:
    members: list[Member]
    fn: Any  # value_and_gradients of the vmapped loss terms
    live: list[Member] = field(default_factory=list)
    deadline: Deadline = NEVER  # the batch's; its seconds decide the trace (exhume.attacks.kkt.traces)
    graph: Any = None  # the traced fn, once traced
    trace_state: Any = None  # None (not yet), the traced shapes, or 'failed'
    checked: bool = False  # one evaluation ran: vmap runs this module


def open_batch(view, restarts: list[Restart], method: str, store, resume: bool, device: str) -> Batch:
    """The problems of ``restarts``: the first built as a lone run builds it, the others sharing its working copy,
    equation and span and drawing their own starting point from their seed (what a lone run of theirs would draw).
    A group whose runs take the feature stage (:meth:`~exhume.attacks.kkt.KKTAttack.stage_on`, the predicate a lone run
    asks) cannot be batched."""
    from exhume.attacks import get_attack
    from exhume.attacks.kkt import Step

    why = get_attack(method, **restarts[0].kwargs).unbatched_on(view)
    if why is not None:
        raise NotBatchable(why)
    dev = torch.device(device)
    members: list[Member] = []
    first = None
    for r in restarts:
        atk = get_attack(method, **r.kwargs)
        atk.check(view)
        p = atk.problem(view, dev, r.seed, None, shared=first)
        if first is None:
            first = p
        opts, tracker, run = atk.open_state(view, p, store.folder(r.index), resume and store.folder(r.index) is not None, r.seed)
        members.append(Member(r, atk, p, Step(atk.config, p, opts, tracker, run.history), run))
    return Batch(members, value_and_gradients(vmapped_terms(members[0])), list(members))


def vmapped_terms(lead: Member):
    """``(X, U) -> (terms (R, 4), U')``: every restart's loss terms (:func:`exhume.attacks.kkt.terms`, the settings and
    problem of ``lead``, which the batch shares) and its multipliers after the step's evaluation (the closed-form ones
    where they are solved, else ``U`` itself)."""
    from exhume.attacks.kkt import terms
    from exhume.attacks.kkt.terms import solved_u

    cfg, p = lead.attack.config, lead.problem

    def one(x, u):  # noqa: ANN001, ANN202
        t = terms(cfg, p, x, u)
        return torch.stack(t[:4]), (u if t.lam is None else solved_u(p, t.lam))

    return torch.func.vmap(one)


def value_and_gradients(vmapped):
    """``(X, U) -> (terms (R, 4), ∂/∂X, ∂/∂U, U')``: every restart's loss terms and the gradients of their sum, which
    are each restart's own (the restarts share no unknown), through ``torch.func`` alone (no autograd graph kept)."""

    def total(X, U):  # noqa: ANN001, ANN202, N803
        terms, solved = vmapped(X, U)
        return terms[:, 0].sum(), (terms.detach(), solved.detach())

    def f(X, U):  # noqa: ANN001, ANN202, N803
        (gx, gu), (_, (terms, solved)) = torch.func.grad_and_value(total, argnums=(0, 1), has_aux=True)(X, U)
        return terms, gx, gu, solved

    return f


def evaluate(batch) -> tuple[torch.Tensor, ...]:
    """:func:`~exhume.portfolio.batched.engine.value_and_gradients` at the live restarts' unknowns: eager in a short run, else replayed from its trace
    from the first step (traced again when a restart leaves the batch; :func:`exhume.attacks.kkt.traces`)."""
    args = (torch.stack([m.problem.x.detach() for m in batch.live]), torch.stack([m.problem.u.detach() for m in batch.live]))
    if batch.trace_state != "failed" and traces(batch.live[0].attack.config["iterations"], batch.deadline.seconds):
        key = (tuple(args[0].shape), tuple(args[1].shape))
        if batch.trace_state != key:
            batch.graph, why = traced(batch.fn, args, TRACING_MODE)
            batch.trace_state = key if batch.graph is not None else "failed"
            batch.members[0].problem.form.info.update(residual_traced=batch.graph is not None,
                                                      residual_trace_note=f"restarts batched through torch.func.vmap, {why}")
        if batch.graph is not None:
            return batch.graph(*args)
    return batch.fn(*args)


def batched_step(batch: Batch, it: int, log: bool, clock) -> dict[str, str] | None:
    """Iteration ``it`` of every live restart: one vmapped evaluation of every loss and gradient, then each restart's
    own :meth:`~exhume.attacks.kkt.Step.advance` (a divergent restart leaves the batch, its error recorded)."""
    live = batch.live
    try:
        terms, gx, gu, solved = evaluate(batch)
    except (RuntimeError, NotImplementedError) as e:
        if batch.checked:
            raise
        # the first evaluation tells whether vmap runs this module; no update has been made
        raise NotBatchable(f"torch.func.vmap cannot run this module ({type(e).__name__}: {str(e)[:200]})") from None
    batch.checked = True
    rows = terms.tolist()  # one synchronisation for every restart's divergence check and record
    batch.live, records = [], []
    for k, mem in enumerate(live):
        p = mem.problem
        p.x.grad = gx[k]
        if not p.closed:
            p.u.grad = gu[k]
        try:
            records.append(mem.step.advance(it, log, clock, rows[k], solved[k] if p.closed else None))
        except DivergenceError as e:
            mem.error = str(e)
            continue
        batch.live.append(mem)
    if not batch.live:
        raise DivergenceError(f"every restart of the batch diverged by iteration {it}")
    return {"stat": f"{min(r['stationarity'] for r in records):.3g}"} if log else None
