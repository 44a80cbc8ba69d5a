"""Running restarts: one restart in this process, or many side by side in local worker processes.

On Linux with a CPU device, worker processes are **forked**: any ``nn.Module`` works, even one
whose class was defined in a notebook or in a script without an ``if __name__ == "__main__":``
guard, and the view is inherited rather than sent. A forked child must not enter an OpenMP
parallel region that its parent already used (GNU libgomp is not fork-safe), so each forked
worker runs torch with **one thread**; the default number of workers is the number of cores.
Elsewhere (macOS, Windows, or a GPU device, where a forked child cannot use CUDA) workers are
**spawned** (fresh interpreters), each with ``max(1, cores // workers)`` torch threads; the view
travels pickled in memory (never through a file) through a queue that every worker reads once it
has started, so the workers start side by side (as start-up arguments it would be written to each
new interpreter only after the one before had imported torch), the module's class must be
importable and a script must guard its entry point as :mod:`multiprocessing` requires.

With a time budget, each pending restart ends at the end of its wave (:func:`restart_ends`: the
time left until the portfolio's deadline, split into equal waves), a :class:`~exhume.deadline.Deadline`
handed to its attack (spawned workers receive it pickled): worker start-up and a restart's
set-up come out of its own wave, and a wave that starts late gets only what is left.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from exhume.deadline import NEVER, Deadline
from exhume.errors import ConfigError, DivergenceError
from exhume.portfolio.plan import Restart, local_cores
from exhume.portfolio.pool import restart_record

HOST = socket.gethostname()


#: status of a restart not started, or stopped, because the portfolio's deadline had passed (not stored as finished:
#: ``--resume`` runs it, from its checkpoint if it has one)
UNFINISHED = "not finished: the budget was spent"


def run_restart(view, method: str, restart: Restart, folder, resume: bool, device: str, progress: bool,
                end: Deadline = NEVER, deadline: Deadline = NEVER, at_least_one: bool = False,
                every: tuple[int | None, int | None] = (None, None)):
    """One restart: one run of the registered attack. Returns ``(reconstruction or None, table row)``.

    A run that diverges (DivergenceError) is a failed restart, not a failed portfolio: its row
    says so and the other restarts still count. A bad setting (ConfigError) stops the portfolio.
    ``end``: the restart stops there, set-up included, and after its own ``seconds`` at the latest; a restart that
    starts after its ``end`` gets what is left until ``deadline`` (the portfolio's), and one that starts after
    ``deadline`` is not run (its row says :data:`UNFINISHED`), unless ``at_least_one``: then it runs one iteration, so
    that a budget spent before any restart began (set-up, the sizing probe) still gives candidates rather than no
    result at all. ``every``: its ``(checkpoint_every, log_every)``.
    """
    from exhume.attacks import get_attack

    if end.passed():
        end = deadline if deadline.bounded else end
        if end.passed() and not at_least_one:
            return None, restart_record(restart, None, UNFINISHED, HOST, iterations=0)
        # past it with at_least_one: the loop's one iteration, then it stops
    atk = get_attack(method, **restart.kwargs)
    try:
        recon = atk.run(view, out=folder, seed=restart.seed, device=device, resume=resume and folder is not None,
                        progress=progress, deadline=end.sooner(restart.seconds), checkpoint_every=every[0], log_every=every[1])
    except DivergenceError as e:
        return None, restart_record(restart, None, "diverged", HOST, error=str(e))
    return recon, restart_record(restart, recon, "complete", HOST)


def pickled_view(view) -> bytes:
    try:
        return pickle.dumps(view)
    except Exception as e:  # noqa: BLE001 - a lambda or open handle inside the user's module
        raise ConfigError(f"the victim's module cannot be sent to worker processes ({type(e).__name__}: {e}); "
                          "use workers=1 (--workers 1)") from None


def start_method(device: str) -> str:
    """``fork`` on Linux for CPU work, else ``spawn`` (see the module's docstring)."""
    if sys.platform.startswith("linux") and str(device).startswith("cpu") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def threads_per_worker(workers: int, method: str) -> int:
    return 1 if method == "fork" else max(1, local_cores() // max(1, workers))


_STATE: dict[str, Any] = {}


def _worker_signals() -> None:
    """SIGTERM and SIGINT interrupt a worker's restart as Ctrl-C does (it checkpoints), whatever the parent had.

    On Linux a worker also gets SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so a
    killed ``exhume`` (SIGKILL, the OOM killer) leaves checkpoints, not orphans spending their budget.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.platform.startswith("linux"):
        import ctypes

        parent = multiprocessing.parent_process()  # its pid was recorded when this worker was started
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl: the worker outlives a killed parent, as before
            return
        if parent is not None and os.getppid() != parent.pid:  # the parent died before prctl took effect
            os._exit(128 + int(signal.SIGTERM))


def _raise_interrupt(signum, frame):
    if not _STATE.get("busy"):  # idle between restarts: nothing to checkpoint
        os._exit(128 + signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _init_worker(views, threads: int) -> None:
    import torch

    _worker_signals()
    torch.set_num_threads(threads)
    _STATE["view"] = pickle.loads(views.get())  # noqa: S301 - bytes made by the parent process, not a file


def _init_forked(threads: int) -> None:
    import torch

    _worker_signals()
    torch.set_num_threads(threads)


def _run_local(method: str, rec: dict[str, Any], folder, resume: bool, device: str, end: Deadline = NEVER,
               deadline: Deadline = NEVER, every: tuple[int | None, int | None] = (None, None)):
    from exhume.portfolio.store import LocalStore

    restart = Restart.from_record(rec)
    _STATE["busy"] = True
    try:
        recon, row = run_restart(_STATE["view"], method, restart, folder, resume, device, False, end, deadline, every=every)
    except KeyboardInterrupt:  # SIGTERM/SIGINT: the restart has checkpointed; a stopped worker takes no more work
        os._exit(130)
    finally:
        _STATE["busy"] = False
    if folder is not None and row.status != UNFINISHED:
        LocalStore(folder.parent.parent).save(restart, recon, row)
    return rec["restart"], recon, row


def executor(view, workers: int, device: str) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes that each hold the attacker's view."""
    method = start_method(device)
    ctx = multiprocessing.get_context(method)
    threads = threads_per_worker(workers, method)
    if method == "fork":
        import torch

        torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # imports torch._dynamo (seconds) once, before forking
        _STATE["view"] = view  # inherited by the forked children
        return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_forked, initargs=(threads,))
    views = ctx.Queue()  # one copy for each worker, read once it has started (see the module's docstring)
    payload = pickled_view(view)
    for _ in range(workers):
        views.put(payload)
    views.cancel_join_thread()  # a worker that never started must not hold this process at its exit
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(views, threads))


def restart_ends(pending: list[Restart], workers: int, deadline: Deadline) -> dict[int, Deadline]:
    """When each pending restart ends: the time left until ``deadline`` split into equal waves of ``workers``
    restarts, in the order they are handed out (all never without a deadline)."""
    if not deadline.bounded or not pending:
        return {r.index: NEVER for r in pending}
    workers = max(1, min(workers, len(pending)))
    waves = math.ceil(len(pending) / workers)
    return {r.index: deadline.share((k // workers + 1) / waves) for k, r in enumerate(pending)}


#: seconds past the portfolio's deadline that the workers get to hand back their last restarts before they are stopped
STOP_GRACE = 2.0


def run_pending(view, plan, pending: list[Restart], store, workers: int, resume: bool, device: str, progress: bool,
                on_done: Callable[[int, Any, dict[str, Any]], None], deadline: Deadline = NEVER) -> None:
    """Run the ``pending`` restarts, in this process (one worker) or in ``workers`` processes, each by the end of
    its wave before ``deadline`` (never: each restart by its own budget).

    With several workers this process is one of them: it runs the first restart of every wave itself (warm: no
    start-up) while ``workers - 1`` worker processes run the others, so a portfolio whose workers start slowly still
    has results by its deadline. Workers still busy ``STOP_GRACE`` seconds after the deadline are stopped (each
    checkpoints its restart, which ``--resume`` continues); their rows say :data:`UNFINISHED`."""
    workers = min(workers, len(pending)) if pending else 0
    ends = restart_ends(pending, workers, deadline)
    here = pending[::max(workers, 1)]
    there = [r for r in pending if r.index not in {h.index for h in here}]
    pool = executor(view, workers - 1, device) if there else None
    try:
        futures = {pool.submit(_run_local, plan.method, r.record(), store.folder(r.index), resume, device, ends[r.index], deadline,
                               plan.every): r for r in there}
        threads = threads_per_worker(workers, start_method(device)) if pool is not None else None
        for k, restart in enumerate(here):
            _run_here(view, plan, restart, store, resume, device, progress and pool is None, ends[restart.index],
                      deadline, threads, on_done, at_least_one=k == 0)
            futures = _collect(futures, on_done, 0.0)
        futures = _collect(futures, on_done, None if not deadline.bounded else deadline.left() + STOP_GRACE)
    except BaseException:  # Ctrl-C, SIGTERM, a failed restart: stop the workers, each checkpointing its restart
        if pool is not None:
            stop_workers(pool)
        raise
    finally:
        _STATE.clear()
    if pool is not None:
        if futures:  # past the deadline: stopped, their restarts checkpointed
            stop_workers(pool)
        pool.shutdown(wait=True)
    for restart in futures.values():
        on_done(restart.index, None, restart_record(restart, None, UNFINISHED, HOST, iterations=0))


def _run_here(view, plan, restart: Restart, store, resume: bool, device: str, progress: bool, end: Deadline,
              deadline: Deadline, threads: int | None, on_done, at_least_one: bool = False) -> None:
    """One restart in this process (at ``threads`` torch threads, as a worker would run it), stored and reported."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        recon, row = run_restart(view, plan.method, restart, store.folder(restart.index), resume, device, progress, end, deadline,
                                 at_least_one, plan.every)
    finally:
        torch.set_num_threads(before)
    if row.status != UNFINISHED:
        store.save(restart, recon, row)
    on_done(restart.index, recon, row)


def _collect(futures: dict, on_done, timeout: float | None) -> dict:
    """Report the finished ``futures`` (waiting at most ``timeout`` seconds for all; None: no limit); the others."""
    if futures:
        done, _ = wait(futures, timeout=timeout, return_when=ALL_COMPLETED)
        for f in done:
            on_done(*f.result())
        futures = {f: r for f, r in futures.items() if f not in done}
    return futures


def stop_workers(pool: ProcessPoolExecutor, timeout: float = 120.0) -> None:
    """Cancel the restarts not started and interrupt the running ones (SIGTERM: each checkpoints and stops).

    Without this the pool's shutdown would wait for every queued and running restart to spend
    its whole budget after the parent was interrupted (SIGTERM reaches the parent only).
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown, which forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout)


__all__ = ["UNFINISHED", "executor", "restart_ends", "run_pending", "run_restart"]
