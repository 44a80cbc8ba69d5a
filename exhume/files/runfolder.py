"""Run folders owned by one run: a lock file, no silent overwrite, a victim fingerprint.

``RUN/.exhume.lock`` holds the writer's pid; a second writer is refused while that process lives,
and a lock left by a dead process is taken over. A folder that already holds a run
(``checkpoint.pt`` or ``reconstruction.json``) is continued only with ``resume=True`` and
replaced only with ``force=True``; ``force`` never overrides the lock of a live run (the lock is
taken before anything is removed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from exhume.errors import ConfigError, ExhumeError

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take(lock: Path) -> bool:
    """Create ``lock`` holding this pid in one step (a hard link of a written file), so that no
    other process ever reads it empty and mistakes it for a stale lock."""
    tmp = lock.with_name(f"{lock.name}.{os.getpid()}.tmp")
    tmp.write_text(str(os.getpid()))
    try:
        os.link(tmp, lock)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _prepare(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"output folder {folder} exists and is not a folder; give -o a folder path")
    folder.mkdir(parents=True, exist_ok=True)


@contextmanager
def own_run_folder(folder: str | Path, resume: bool = False, force: bool = False, run_files: tuple[str, ...] = RUN_FILES,
                   resume_from: str = "checkpoint.pt") -> Iterator[Path]:
    """Hold ``folder``'s lock while the body runs; refuse an existing run unless resumed or forced.

    ``run_files``: the entries that mean a run is already there (a restart portfolio keeps its
    restarts in ``restarts/``); ``resume_from``: the entry a resumed run continues from.
    """
    if resume and force:
        raise ConfigError("--resume and --force exclude each other: continue the run or replace it")
    folder = Path(folder)
    _prepare(folder)
    lock = folder / LOCK_NAME
    for _ in range(3):
        if _take(lock):
            break
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid) and pid != os.getpid():
            raise RunFolderError(f"output folder {folder} is in use by another exhume run (pid {pid}, lock {lock}); "
                                 + ("--force replaces only a finished or abandoned run: " if force else "")
                                 + "wait for it to finish or choose another -o")
        lock.unlink(missing_ok=True)  # stale: its process is gone
    else:
        raise RunFolderError(f"cannot take the lock {lock}; another run keeps taking it")
    try:
        existing = [n for n in run_files if (folder / n).exists()]
        if existing and not (resume or force):
            raise RunFolderError(f"output folder {folder} already holds a run ({', '.join(existing)}); "
                                 "pass --resume to continue it, --force to replace it, or choose another -o")
        if resume and not (folder / resume_from).exists():
            raise RunFolderError(f"cannot resume: {folder / resume_from} does not exist (no run was checkpointed there)")
        if force:
            for n in run_files:
                path = folder / n
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        yield folder
    finally:
        lock.unlink(missing_ok=True)
