"""A portfolio's restarts as one batched problem in one process: how one GPU is filled.

Spawned worker processes share a GPU badly (a CUDA context each, small kernels side by side).
Here the restarts of a group run in lock-step: their candidates are stacked ``(R, m, …)`` and one
call of ``torch.func.vmap`` over the restart dimension evaluates every restart's loss terms
(:func:`exhume.attacks.kkt.terms`), its own stationarity residual ``θ − Σ_{j∈r} λ_j ∇_θ h_j``
included (so one restart's candidates never explain another's weights); one backward pass of the
sum gives each restart exactly its own gradients. The rest of each restart's step is the single
run's own (:meth:`exhume.attacks.kkt.Step.advance`): its optimisers (a variant's ``lr_lambda``),
the projection, the averaged iterates and snapshots, the history; so are its seed's starting point,
the checkpoint in ``OUT/restarts/<k>/`` (a batched restart resumes alone or batched) and the result.
At equal iterations the candidates are those of the restarts run one by one, up to rounding
(``tests/test_batched.py``, float64, every kkt setting that enters the step).

Restarts batch together when their settings differ only in :data:`PER_RESTART` (the default
variants do); other groups run one after another, the deadline's time split by their sizes. A divergent
restart leaves the batch and is recorded as diverged, as a lone one is. A module that ``vmap``
cannot run (control flow on tensor values) leaves the group to the usual path.

``batch_restarts="auto"`` (:func:`use_batched`) picks this path on a CUDA device, which one process per restart
shares badly; on CPU forked one-thread workers stay the default (docs/defaults.md#portfolio-workers; ``--batch-restarts
on`` asks for this path). TF32 stays off (:func:`no_tf32`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from exhume.attacks.engine.base import ATTACKS
from exhume.attacks.kkt import traces
from exhume.choices import BATCH_CHOICES
from exhume.deadline import NEVER, Deadline
from exhume.errors import ConfigError, DivergenceError
from exhume.portfolio.plan import Restart

#: make_fx's mode: real tensors (fake ones gave a graph whose replay failed on a view under vmap)
TRACING_MODE = "real"
#: settings restarts of one batch may differ in: they touch only each restart's optimisers
PER_RESTART = ("lr", "lr_lambda")


def use_batched(setting: str, device: str, method: str, storage: str | None,
                unbatched: Callable[[], str | None] | None = None) -> tuple[bool, str]:
    """``(batched?, why)`` for ``batch_restarts=setting``; 'on' where it cannot apply is one clear error. ``unbatched()``:
    why this attack's runs on this victim have no batched path (:meth:`~exhume.attacks.engine.base.Attack.unbatched_on`), asked
    only where batching would otherwise be chosen."""
    if setting not in BATCH_CHOICES:
        raise ConfigError(f"batch_restarts must be one of {', '.join(BATCH_CHOICES)}, got {setting!r}")
    batchable = sorted(name for name, cls in ATTACKS.items() if cls.batchable)
    cannot = (f"the {method} attack has no batched path (only {', '.join(batchable)})" if method not in batchable
              else "a shared study (storage) runs its restarts one per process, on any machine" if storage is not None else None)
    if setting == "off":
        return False, "batch_restarts='off'"
    if not cannot and unbatched is not None and (setting == "on" or torch.device(device).type == "cuda"):
        cannot = unbatched()
    if setting == "on":
        if cannot:
            raise ConfigError(f"batch_restarts='on' cannot apply: {cannot}; use 'auto' or 'off'")
        return True, "asked for (batch_restarts='on')"
    if cannot:
        return False, cannot
    if torch.device(device).type == "cuda":
        return True, "auto: a CUDA device is filled by one batched process"
    return False, "auto: on CPU, one forked worker per core"


@dataclass
class Batching:
    """The path a portfolio's local restarts take (:func:`use_batched`) and, when batched, each group's record."""

    used: bool
    why: str
    groups: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def choose(cls, setting: str, device: str, method: str, storage: str | None,
               unbatched: Callable[[], str | None] | None = None) -> Batching:
        return cls(*use_batched(setting, device, method, storage, unbatched))

    def record(self) -> dict[str, Any]:
        return {"used": self.used, "why": self.why, **({"groups": self.groups} if self.groups else {})}


def batch_key(restart: Restart) -> str:
    """What must be equal for two restarts to share a batch (their settings less :data:`PER_RESTART`)."""
    return json.dumps({k: v for k, v in restart.kwargs.items() if k not in PER_RESTART}, sort_keys=True, default=str)


def groups(pending: list[Restart], capacity: int | None = None) -> list[list[Restart]]:
    """The pending restarts grouped by :func:`batch_key`, in order of their first restart, each group cut into
    batches of at most ``capacity`` restarts (None: no limit)."""
    out: dict[str, list[Restart]] = {}
    for r in pending:
        out.setdefault(batch_key(r), []).append(r)
    size = max(1, capacity or len(pending) or 1)
    return [g[i:i + size] for g in out.values() for i in range(0, len(g), size)]


def capacity(view, method: str, restart: Restart, device: str) -> int | None:
    """How many restarts one batch may hold: the memory available on ``device`` over one restart's estimated peak
    (:mod:`exhume.attacks.engine.memory`; conservative, the set-up's peak is counted in every restart); None when unknown."""
    from exhume.attacks import get_attack
    from exhume.attacks.engine.memory import available_bytes

    need = get_attack(method, **restart.kwargs).peak_memory_bytes(view)
    room = available_bytes(device)
    return None if not need or room is None else max(1, room // need)


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
    """The problems of ``restarts``: the first built as a lone run builds it, the others sharing its equation
    and drawing their own starting point from their seed (what a lone run of theirs would draw)."""
    from exhume.attacks import get_attack
    from exhume.attacks.kkt import Step, resolve_lr_lambda

    dev = torch.device(device)
    members: list[Member] = []
    first = None
    for r in restarts:
        atk = get_attack(method, **r.kwargs)
        atk.check(view)
        if first is None:
            p = first = atk.problem(view, dev, r.seed, None)
        else:
            x, u = atk.unknowns(view, first.m, first.form.signed, first.eq, r.seed, None, dev)
            u.requires_grad_(not first.closed)
            with torch.no_grad():
                x.copy_(first.span.project(x))
            form = first.form.name if first.eq is None else "output"
            p = replace(first, x=x, u=u, lr_lambda=resolve_lr_lambda(atk.config["lr_lambda"], form))
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


def trace(f, args) -> Any:
    """``f`` traced once into a graph of tensor operations (``make_fx``) and checked against ``f`` on ``args``;
    None when it cannot be traced or its replay disagrees (as :class:`~exhume.equations.stationarity.TracedResidual`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from exhume.equations.stationarity import replay_agrees

    try:
        graph = make_fx(f, tracing_mode=TRACING_MODE, _allow_non_fake_inputs=True)(*args)
        got = graph(*args)
    except Exception:  # noqa: BLE001 - any failure to trace or replay leaves the batch eager
        return None
    return graph if replay_agrees(got, f(*args)) else None


def evaluate(batch: Batch) -> tuple[torch.Tensor, ...]:
    """:func:`value_and_gradients` at the live restarts' unknowns: eager in a short run, else replayed from its trace
    from the first step (traced again when a restart leaves the batch; :func:`exhume.attacks.kkt.traces`)."""
    args = (torch.stack([m.problem.x.detach() for m in batch.live]), torch.stack([m.problem.u.detach() for m in batch.live]))
    if batch.trace_state != "failed" and traces(batch.live[0].attack.config["iterations"], batch.deadline.seconds):
        key = (tuple(args[0].shape), tuple(args[1].shape))
        if batch.trace_state != key:
            batch.graph = trace(batch.fn, args)
            batch.trace_state = key if batch.graph is not None else "failed"
            info = batch.members[0].problem.form.info
            info.update(residual_traced=batch.graph is not None, residual_trace_note="restarts batched through torch.func.vmap, "
                        + ("traced once, replayed every step" if batch.graph is not None else "eager: the batch cannot be traced"))
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
        raise _NotBatchable(f"torch.func.vmap cannot run this module ({type(e).__name__}: {str(e)[:200]})") from None
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


def run_group(view, method: str, restarts: list[Restart], store, resume: bool, device: str, progress: bool,
              deadline: Deadline, every: tuple[int | None, int | None] = (None, None)) -> list[tuple[Member, Any]]:
    """Run one group of restarts batched until ``deadline`` or their iteration budget, checkpointing and logging
    ``every`` ``(checkpoint_every, log_every)`` steps (None: the attack's); ``[(member, result)]``."""
    from exhume.attacks.engine.loop import run_loop
    from exhume.attacks.engine.priors import background_level
    from exhume.heap import retained_heap

    batch = open_batch(view, restarts, method, store, resume, device)
    starts = {m.run.start for m in batch.members}
    if len(starts) > 1:
        raise _NotBatchable(f"their checkpoints stand at different iterations ({sorted(starts)})")
    lead = batch.members[0]
    cfg, start = lead.attack.config, lead.run.start
    checkpoint_every, log_every = lead.attack.cadence(*every)
    lead.problem.form.info.update(residual_traced=False, residual_trace_note="restarts batched through torch.func.vmap, eager: "
                                  "a short run by its settings (exhume.attacks.kkt.traces)")
    batch.deadline = deadline

    def save(done: int, elapsed: float) -> None:
        for mem in batch.live:
            mem.run.save(done, elapsed)

    with retained_heap(), no_tf32():
        try:
            end = run_loop(f"kkt batch of {len(restarts)}", cfg["iterations"], deadline, start, lead.run.elapsed,
                           lambda it, log, clock: batched_step(batch, it, log, clock), save,
                           log_every=log_every, checkpoint_every=checkpoint_every, progress=progress)
        except DivergenceError:  # every restart diverged: each one's error is recorded
            end = None
    tau = background_level(cfg["background"], view.mean, tuple(view.input_shape))
    out = []
    for mem in batch.members:
        if mem.error is not None or end is None:
            out.append((mem, None))
            continue
        mem.step.close(end.done)
        out.append((mem, mem.attack.result(mem.problem, end, mem.run, mem.step.tracker, tau, mem.restart.seed, "noise", view)))
    return out


@contextmanager
def no_tf32():
    """TF32 off inside (matmuls and cuDNN convolutions; cuDNN's default is on), restored after: no measurement yet
    shows TF32 gives the batched restarts equal results."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


class _NotBatchable(Exception):
    """This group cannot run batched (the reason is the message): it runs the usual way."""


def run_batched(view, plan, pending: list[Restart], store, resume: bool, device: str, progress: bool, on_done,
                deadline: Deadline = NEVER) -> list[dict[str, Any]]:
    """Run ``pending`` batched, group by group (the time left until ``deadline`` split by group size); returns one
    record per group.

    A group that cannot be batched (vmap fails on the module, checkpoints at different iterations) runs
    one restart after another in this process, as ``workers=1`` does; its record says why.
    """
    from exhume.portfolio.pool import restart_record
    from exhume.portfolio.runner import HOST, run_pending

    records = []
    left = len(pending)
    cap = capacity(view, plan.method, pending[0], device) if pending else None
    for group in groups(pending, cap):
        share = deadline.share(len(group) / left)
        left -= len(group)
        try:
            done = run_group(view, plan.method, group, store, resume, device, progress, share, plan.every)
        except _NotBatchable as e:
            records.append({"restarts": [r.index for r in group], "batched": False, "reason": str(e)})
            run_pending(view, plan, group, store, 1, resume, device, progress, on_done, share)
            continue
        seconds = None if share.seconds is None else round(share.seconds, 3)
        records.append({"restarts": [r.index for r in group], "batched": True, "seconds_given": seconds, "tf32": False})
        for mem, recon in done:
            if recon is None:
                row = restart_record(mem.restart, None, "diverged", HOST, batch=len(group),
                                     error=mem.error or "the batch ended without a complete step")
            else:
                recon.record = replace(recon.record, batched_restarts=len(group))
                row = restart_record(mem.restart, recon, "complete", HOST, batch=len(group))
            store.save(mem.restart, recon, row)
            on_done(mem.restart.index, recon, row)
    return records


__all__ = ["BATCH_CHOICES", "Batching", "groups", "run_batched", "use_batched"]
