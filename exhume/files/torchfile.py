"""Files written with ``torch.save`` (attack and training checkpoints): atomic writes, safe reads.

Written to a temporary file and renamed into place (:func:`exhume.files.jsonio.atomic_write`), so
an interrupted or failed write never leaves a corrupt file nor a stray temporary one. Read with
``torch.load(weights_only=True)``, which restores tensors, numbers, strings, lists and dicts but
never executes code, after checking the file's size against ``LIMITS.torch_file_bytes``. Every
failure is one :class:`~exhume.errors.ExhumeError` naming the file.
"""

from __future__ import annotations

import io
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
    """``torch.save(payload)`` into ``path`` atomically (a full disk raises OSError and leaves no temporary file)."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write(Path(path), buffer.getbuffer())


def load_torch(path: str | Path, failure: str, what: str, advice: str = "") -> Any:
    """The payload of a ``torch.save`` file, or ``ExhumeError("{failure} from {path}: not a readable {what} ...")``."""
    path = Path(path)
    tail = f"; {advice}" if advice else ""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ExhumeError(f"{failure} from {path}: cannot read it ({e.strerror or e}){tail}") from None
    if size > LIMITS.torch_file_bytes:
        raise ExhumeError(f"{failure} from {path}: {size} bytes; expected {what} of at most {LIMITS.torch_file_bytes} bytes{tail}")
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
