"""Running restarts: one restart in this process, or many side by side in local worker processes.

On Linux with a CPU device, worker processes are **forked**: any ``nn.Module`` works, even one
whose class was defined in a notebook or in a script without an ``if __name__ == "__main__":``
guard, and the view is inherited rather than sent. A forked child must not enter an OpenMP
parallel region that its parent already used (GNU libgomp is not fork-safe), so each forked
worker runs torch with **one thread**; the default number of workers is the number of cores.
Elsewhere (macOS, Windows, or a GPU device, where a forked child cannot use CUDA) workers are
**spawned** (fresh interpreters), each with ``max(1, cores // workers)`` torch threads; the view
travels pickled in memory (never through a file), so the module's class must be importable and
a script must guard its entry point as :mod:`multiprocessing` requires.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from exhume.errors import ConfigError, DivergenceError
from exhume.portfolio.plan import Restart, local_cores
from exhume.portfolio.pool import restart_record

HOST = socket.gethostname()


def run_restart(view, method: str, restart: Restart, folder, resume: bool, device: str, progress: bool):
    """One restart: one run of the registered attack. Returns ``(reconstruction or None, table row)``.

    A run that diverges (DivergenceError) is a failed restart, not a failed portfolio: its row
    says so and the other restarts still count. A bad setting (ConfigError) stops the portfolio.
    """
    from exhume.attacks import get_attack

    atk = get_attack(method, **restart.kwargs)
    try:
        recon = atk.run(view, out=folder, seed=restart.seed, device=device, resume=resume and folder is not None,
                        progress=progress)
    except DivergenceError as e:
        row = restart_record(restart, None, "diverged", HOST)
        row["error"] = str(e)
        return None, row
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


def _init_worker(view_bytes: bytes, threads: int) -> None:
    import torch

    _worker_signals()
    torch.set_num_threads(threads)
    _STATE["view"] = pickle.loads(view_bytes)  # noqa: S301 - bytes made by the parent process, not a file


def _init_forked(threads: int) -> None:
    import torch

    _worker_signals()
    torch.set_num_threads(threads)


def _run_local(method: str, rec: dict[str, Any], folder, resume: bool, device: str):
    from exhume.portfolio.store import LocalStore

    restart = Restart.from_record(rec)
    _STATE["busy"] = True
    try:
        recon, row = run_restart(_STATE["view"], method, restart, folder, resume, device, False)
    except KeyboardInterrupt:  # SIGTERM/SIGINT: the restart has checkpointed; a stopped worker takes no more work
        os._exit(130)
    finally:
        _STATE["busy"] = False
    if folder is not None:
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
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                               initargs=(pickled_view(view), threads))


def run_pending(view, plan, pending: list[Restart], store, workers: int, resume: bool, device: str, progress: bool,
                on_done: Callable[[int, Any, dict[str, Any]], None]) -> None:
    """Run the ``pending`` restarts, in this process (one worker) or in ``workers`` processes."""
    workers = min(workers, len(pending)) if pending else 0
    if workers <= 1:
        for restart in pending:
            folder = store.folder(restart.index)
            recon, row = run_restart(view, plan.method, restart, folder, resume, device, progress)
            store.save(restart, recon, row)
            on_done(restart.index, recon, row)
        return
    pool = executor(view, workers, device)
    try:
        futures = {pool.submit(_run_local, plan.method, r.record(), store.folder(r.index), resume, device) for r in pending}
        while futures:
            finished, futures = wait(futures, return_when=FIRST_COMPLETED)
            for f in finished:
                on_done(*f.result())
    except BaseException:  # Ctrl-C, SIGTERM, a failed restart: stop the workers, each checkpointing its restart
        stop_workers(pool)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        _STATE.clear()


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


__all__ = ["run_restart", "run_pending", "executor"]
