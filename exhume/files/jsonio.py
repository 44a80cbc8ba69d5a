"""JSON read with size and depth limits, written without NaN/Infinity and atomically."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from exhume.errors import ExhumeError
from exhume.files.limits import LIMITS


def read_json(path: str | Path, error: type[ExhumeError] = ExhumeError, what: str = "a JSON file") -> Any:
    """Parse ``path`` (at most ``LIMITS.json_bytes`` bytes, ``LIMITS.json_depth`` levels deep)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > LIMITS.json_bytes:
            raise error(f"{path}: {size} bytes; expected {what} of at most {LIMITS.json_bytes} bytes")
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"cannot read {path}: not valid JSON ({e}); expected {what}") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply; expected {what}") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    if _depth(data, LIMITS.json_depth) > LIMITS.json_depth:
        raise error(f"{path}: nested more than {LIMITS.json_depth} levels deep; expected {what}")
    return data


def _depth(v: Any, limit: int, level: int = 1) -> int:
    if level > limit:
        return level
    if isinstance(v, dict):
        return max((_depth(x, limit, level + 1) for x in v.values()), default=level)
    if isinstance(v, list):
        return max((_depth(x, limit, level + 1) for x in v), default=level)
    return level


def finite_or_null(v: Any) -> Any:
    """``v`` with every NaN/inf float replaced by None (JSON has no such numbers)."""
    if isinstance(v, dict):
        return {k: finite_or_null(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_or_null(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def atomic_write(path: str | Path, data: bytes | Callable[[BinaryIO], None]) -> None:
    """Write ``data`` (bytes, or a function writing into the open file: no copy held in memory) to a
    temporary file beside ``path`` and rename it into place; on failure (disk full, read-only folder)
    the temporary file is removed and the OSError propagates."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before it replaces the previous file
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {path.name}: {e.strerror or e}", str(path.parent)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any, default=None) -> None:
    """Write ``obj`` as JSON, NaN/inf written as null, atomically."""
    text = json.dumps(finite_or_null(json.loads(json.dumps(obj, default=default))), indent=2, allow_nan=False)
    atomic_write(path, (text + "\n").encode())
