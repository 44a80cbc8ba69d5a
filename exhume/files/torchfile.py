"""Files written with ``torch.save`` (attack and training checkpoints): atomic writes, safe reads.

Written to a temporary file and renamed into place (:func:`exhume.files.jsonio.atomic_write`), so
an interrupted or failed write never leaves a corrupt file nor a stray temporary one. Read with
``torch.load(weights_only=True)``, which restores tensors, numbers, strings, lists and dicts but
never executes code, after checking the file's size against ``LIMITS.torch_file_bytes``. Every
failure is one :class:`~exhume.errors.ExhumeError` naming the file.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from exhume.errors import ExhumeError
from exhume.files.jsonio import atomic_write
from exhume.files.limits import LIMITS


def save_torch(path: str | Path, payload: dict[str, Any]) -> None:
    """``torch.save(payload)`` into ``path`` atomically (a full disk raises OSError and leaves no temporary file),
    streamed into the file: no second copy of the payload is held in memory."""
    atomic_write(Path(path), lambda f: _stream(payload, f))


def _stream(payload: dict[str, Any], f) -> None:
    try:
        torch.save(payload, f)
    except RuntimeError as e:  # torch's zip writer reports a failed write (disk full, file too large) as RuntimeError,
        cause = e.__context__ or e.__cause__  # and an interrupt inside it (Ctrl-C, a chunk's end) too: it stays one
        if isinstance(cause, (OSError, KeyboardInterrupt)):
            raise cause from None
        raise


#: what a checkpoint holds besides its tensors (progress, loss history, settings), at most
CHECKPOINT_SLACK = 64 << 20


def expected_limit(tensor_bytes: int) -> int:
    """The size a checkpoint whose tensors take ``tensor_bytes`` may have: the cap follows what the run itself
    writes (``LIMITS.torch_file_bytes`` at least; 1.25 × the tensors plus :data:`CHECKPOINT_SLACK` above it)."""
    return max(LIMITS.torch_file_bytes, int(1.25 * tensor_bytes) + CHECKPOINT_SLACK)


def state_bytes(tensors: dict[str, torch.Tensor], optimizers: dict[str, torch.optim.Optimizer]) -> int:
    """The bytes of ``tensors`` and of the optimisers' states over their parameters (two per parameter, as Adam keeps)."""
    own = sum(t.numel() * t.element_size() for t in tensors.values())
    params = sum(p.numel() * p.element_size() for o in optimizers.values() for g in o.param_groups for p in g["params"])
    return own + 2 * params


def load_torch(path: str | Path, failure: str, what: str, advice: str = "", limit: int | None = None) -> Any:
    """The payload of a ``torch.save`` file, or ``ExhumeError("{failure} from {path}: not a readable {what} ...")``.

    ``limit``: the largest size accepted (default ``LIMITS.torch_file_bytes``); a reader that knows the
    shapes it restores passes :func:`expected_limit` of their bytes, so a large run's checkpoint resumes.
    """
    path = Path(path)
    tail = f"; {advice}" if advice else ""
    limit = LIMITS.torch_file_bytes if limit is None else limit
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ExhumeError(f"{failure} from {path}: cannot read it ({e.strerror or e}){tail}") from None
    if size > limit:
        raise ExhumeError(f"{failure} from {path}: {size} bytes; expected {what} of at most {limit} bytes{tail}")
    try:
        with warnings.catch_warnings():  # torch's own warnings and advice never reach the user: exhume's line says it all
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" not in str(e).lower():  # e.g. "pickle data was truncated"
            raise ExhumeError(f"{failure} from {path}: not a readable {what} (UnpicklingError: {_first_line(e)}){tail}") from None
        raise ExhumeError(f"{failure} from {path}: it holds pickled Python objects, not only tensors, numbers and strings; "
                          f"expected {what} written by exhume (a pickle is never unpickled){tail}") from None
    except Exception as e:  # noqa: BLE001 - any failure to read is the same user-facing problem
        raise ExhumeError(f"{failure} from {path}: not a readable {what} ({type(e).__name__}: {_first_line(e)}){tail}") from None


def _first_line(e: Exception) -> str:
    """The first line of ``e``'s message without terminal escape codes (torch bolds its advice)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    return text.splitlines()[0] if text else ""
