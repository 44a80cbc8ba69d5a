"""Run folders owned by one run: a lock file, no silent overwrite, a victim fingerprint.

``RUN/.exhume.lock`` records its writer: host name, boot id, PID namespace, pid and the process's
start time (:mod:`exhume.files.runlock`). A second writer is refused while that process lives.
A lock whose process is gone (same host and boot, pid dead or reused; or the host rebooted) is
taken over atomically: of two processes taking it over at once exactly one wins. A lock written
on another host (or in another PID namespace), whose process this one cannot check, is never
taken over without ``force=True``. A process that holds a folder may enter it again (the audit
holds its folder while the attack, the evaluation and the report write into it).

A folder that already holds a run (``checkpoint.pt`` or ``reconstruction.json``) is continued
only with ``resume=True`` and replaced only with ``force=True``; ``force`` never overrides the
lock of a live run on this host (the lock is taken before anything is removed).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exhume.errors import ConfigError, ExhumeError
from exhume.files import runlock

LOCK_NAME = ".exhume.lock"
RUN_FILES = ("checkpoint.pt", "reconstruction.json")


class RunFolderError(ExhumeError):
    """A run folder is in use by another run, or would be overwritten."""


def fingerprint(model) -> str:
    """sha256 of a module's parameters and buffers (names, dtypes, shapes and bytes), 16 hex digits."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def tensors_digest(*tensors) -> str:
    """sha256 of tensors' shapes, dtypes and bytes (what a resumed run must share with its checkpoint)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _prepare(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"output folder {folder} exists and is not a folder; give -o a folder path")
    folder.mkdir(parents=True, exist_ok=True)


#: how long a process waits for another one's takeover of the same stale lock to show
TAKEOVER_WAIT = 5.0
_HELD: dict[str, list[int]] = {}  # folder -> [pid, thread, depth]: folders this process holds (re-entered, not retaken)
_HELD_GUARD = threading.Lock()


def _refusal(folder: Path, lock: Path, holder: runlock.Holder | None, state: str, force: bool, can_force: bool) -> RunFolderError:
    who = holder.describe() if holder is not None else "unknown"
    if state == "live":
        return RunFolderError(f"output folder {folder} is in use by another exhume run ({who}, lock {lock}); "
                              + ("--force replaces only a finished or abandoned run: " if force else "")
                              + "wait for it to finish or choose another -o")
    how = ("pass --force to take the folder over (replacing its run) or delete the lock file to resume it" if can_force
           else "delete the lock file")
    return RunFolderError(f"output folder {folder} is locked by an exhume run on another host or PID namespace ({who}, lock {lock}), "
                          f"which this host cannot check; if that run has ended, {how}; else choose another -o")


def _acquire(folder: Path, lock: Path, force: bool, can_force: bool) -> runlock.Holder:
    """Take ``folder``'s lock: create it, or take a stale one over (a foreign one only with ``force``)."""
    deadline = time.monotonic() + TAKEOVER_WAIT
    while True:
        holder = runlock.me()
        if runlock.create(lock, holder):
            return holder
        raw = runlock.read(lock)
        if raw is None:
            continue  # released meanwhile: create it again
        old = runlock.parse(raw)
        state = runlock.judge(old)
        if state == "live" and old is not None and old.pid == os.getpid():
            state = "stale"  # this process's pid, but no context of this process holds the folder
        if state == "live" or (state == "foreign" and not (force and can_force)):
            raise _refusal(folder, lock, old, state, force, can_force)
        got = runlock.take_over(lock, raw)
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise RunFolderError(f"cannot take the lock {lock}: another process started taking it over and has not finished "
                                 f"({runlock.token_of(lock, raw).name}); if no exhume run uses {folder}, delete both files")
        time.sleep(0.01)


@contextmanager
def _held(folder: Path, force: bool, can_force: bool) -> Iterator[bool]:
    """Hold ``folder``'s lock for the block; yields True when this thread already held it (re-entered)."""
    key, me = str(folder.resolve()), [os.getpid(), threading.get_ident()]
    with _HELD_GUARD:  # registered before the file is taken: another thread of this process never takes it too
        entry = _HELD.get(key)
        again = entry is not None and entry[0] == me[0]
        if again and entry[1] != me[1]:
            raise RunFolderError(f"output folder {folder} is in use by another thread of this process; choose another -o")
        if again:
            entry[2] += 1
        else:
            _HELD[key] = entry = [*me, 1]  # an entry of the parent a forked child inherited is replaced
    if again:
        try:
            yield True
        finally:
            with _HELD_GUARD:
                entry[2] -= 1
        return
    lock = folder / LOCK_NAME
    try:
        holder = _acquire(folder, lock, force, can_force)
    except BaseException:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        raise
    try:
        yield False
    finally:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        runlock.release(lock, holder)


@contextmanager
def own_run_folder(folder: str | Path, resume: bool = False, force: bool = False, run_files: tuple[str, ...] = RUN_FILES,
                   resume_from: str | None = "checkpoint.pt", can_force: bool = True, holds: str = "a run",
                   can_resume: bool = True) -> Iterator[Path]:
    """Hold ``folder``'s lock while the body runs; refuse an existing run unless resumed or forced.

    ``run_files``: the entries that mean a run is already there (a restart portfolio keeps its
    restarts in ``restarts/``; a victim its ``victim.json``), removed by ``force``; ``resume_from``:
    the entry a resumed run continues from (None: a resumed run needs none). ``can_force``: whether
    the command offers ``--force`` (named in the refusal of a foreign lock); ``holds`` and
    ``can_resume`` word the refusal of an existing run. The lock's semantics are in the module
    docstring and :mod:`exhume.files.runlock`.
    """
    if resume and force:
        raise ConfigError("--resume and --force exclude each other: continue the run or replace it")
    folder = Path(folder)
    created = not folder.exists()
    _prepare(folder)
    try:
        with _held(folder, force, can_force):
            refuse_existing(folder, run_files, resume or force, holds, can_resume)
            if resume and resume_from is not None and not (folder / resume_from).exists():
                raise RunFolderError(f"cannot resume: {folder / resume_from} does not exist (no run was checkpointed there)")
            if force:
                for n in run_files:
                    path = folder / n
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
            yield folder
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # a run refused or failed before writing anything leaves no empty folder behind
        raise


def refuse_existing(folder: str | Path, names: tuple[str, ...], allowed: bool, holds: str = "a run", can_resume: bool = False) -> None:
    """Refuse, in one line naming ``--force``, a ``folder`` holding any of ``names`` unless ``allowed``
    (the command was given ``--force`` or ``--resume``): no command replaces an output silently."""
    existing = [n for n in names if (Path(folder) / n).exists()]
    if existing and not allowed:
        raise RunFolderError(f"output folder {folder} already holds {holds} ({', '.join(existing)}); pass "
                             + ("--resume to continue it, " if can_resume else "") + "--force to replace it, or choose another -o")


def _is_run(folder: Path) -> bool:
    return any((folder / n).exists() for n in (*RUN_FILES, "restarts", LOCK_NAME))


@contextmanager
def own_output(path: str | Path, file: bool = False) -> Iterator[Path]:
    """Hold the lock that covers writing ``path`` (a folder, or a file with ``file=True``): the run
    folder it sits in (``RUN/evaluation``, ``RUN/report.html``: the attack's lock), else its own folder.
    Nothing there is refused as an existing run (an evaluation or a report is rewritten)."""
    folder = Path(path).parent if file else Path(path)
    if not _is_run(folder) and _is_run(folder.parent):
        folder = folder.parent
    if file and not folder.is_dir():  # a file's folder is not created here (the writer names a missing run folder)
        yield folder
        return
    with own_run_folder(folder, run_files=(), can_force=False):
        yield folder


def holding_output(where: Callable[[dict[str, Any]], str | Path | None], file: bool = False):
    """Decorator: while the function runs, hold :func:`own_output` of ``where(arguments)`` (None: no lock).

    ``where`` gets the call's arguments by name, defaults applied (e.g. ``lambda a: a["out"]``).
    """

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            path = where(bound.arguments)
            if path is None:
                return fn(*args, **kwargs)
            with own_output(path, file=file):
                return fn(*args, **kwargs)

        return inner

    return wrap


def publish_copy(src: str | Path, dst: str | Path, wanted=None) -> bool:
    """Replace the folder ``dst`` by a copy of the folder ``src``, however many writers publish at once: each copies to
    a temporary sibling of its own, then, one at a time (``fcntl.flock`` on ``.NAME.lock`` beside ``dst``, released by
    the system however its holder ends), moves the old ``dst`` aside and renames its copy into place. No writer copies
    into a folder another removes; a reader sees a whole folder, the old or the new. ``wanted()``, asked under the
    lock, may say that the copy is stale by then (another writer published a newer one): nothing is replaced. Returns
    whether ``dst`` was replaced."""
    import fcntl

    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    old = tmp.with_suffix(".old")
    lock = os.open(dst.with_name(f".{dst.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        shutil.copytree(src, tmp)
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for another writer's swap; closing the descriptor releases it
        if wanted is not None and not wanted():
            return False
        if dst.exists():
            os.replace(dst, old)
        os.replace(tmp, dst)
        return True
    finally:
        os.close(lock)
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
