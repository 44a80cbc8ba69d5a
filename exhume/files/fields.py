"""Typed field checks with one-line errors that name the file and the field."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from exhume.errors import ConfigError, ExhumeError

_MISSING = object()


class Fields:
    """Check the fields of one mapping read from ``source`` (a file name, used in every message).

    ``error`` is the :class:`ExhumeError` subclass raised. Each getter returns the checked value
    (``default`` when the field is absent and not required).
    """

    def __init__(self, data: Any, source: str, error: type[ExhumeError] = ExhumeError, prefix: str = "") -> None:
        self.source, self.error, self.prefix = source, error, prefix
        if not isinstance(data, dict):
            self.fail(None, f"expected an object (a mapping of names to values), got {_kind(data)}")
        self.data = data

    def fail(self, key: str | None, what: str):
        name = self.prefix + key if key is not None else self.prefix.rstrip(".")
        where = f"field {name!r}: " if name else ""
        raise self.error(f"{self.source}: {where}{what}")

    def _get(self, key: str, required: bool, default: Any) -> Any:
        """The field's value, or ``_MISSING`` when it is absent (or null) and not required."""
        if key not in self.data or self.data[key] is None:
            if required:
                self.fail(key, "missing" if key not in self.data else "expected a value, got null")
            return _MISSING
        return self.data[key]

    def sub(self, key: str, required: bool = True) -> Fields | None:
        value = self._get(key, required, None)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            self.fail(key, f"expected an object, got {_kind(value)}")
        return Fields(value, self.source, self.error, f"{self.prefix}{key}.")

    def int(self, key: str, low: int | None = None, high: int | None = None, required: bool = True, default: Any = None) -> Any:
        value = self._get(key, required, default)
        if value is _MISSING:
            return default
        return check_int(value, low, high, lambda what: self.fail(key, what))

    def float(self, key: str, low: float | None = None, high: float | None = None, required: bool = True,
              default: Any = None, finite: bool = True) -> Any:
        value = self._get(key, required, default)
        if value is _MISSING:
            return default
        return check_float(value, low, high, lambda what: self.fail(key, what), finite)

    def str(self, key: str, choices: Sequence[str] | None = None, required: bool = True, default: Any = None,
            max_len: int = 4096) -> Any:
        value = self._get(key, required, default)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_kind(value)}")
        if len(value) > max_len:
            self.fail(key, f"expected at most {max_len} characters, got {len(value)}")
        if choices is not None and value not in choices:
            self.fail(key, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def int_list(self, key: str, low: int | None = None, high: int | None = None, required: bool = True,
                 min_len: int = 0, max_len: int = 64) -> Any:
        value = self._get(key, required, None)
        if value is _MISSING:
            return None
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            self.fail(key, f"expected a list of {min_len} to {max_len} integers, got {_kind(value)}")
        return [check_int(v, low, high, lambda what, i=i: self.fail(key, f"item {i}: {what}")) for i, v in enumerate(value)]

    def object(self, key: str, required: bool = False) -> Any:
        value = self._get(key, required, None)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            self.fail(key, f"expected an object, got {_kind(value)}")
        return value

    def list(self, key: str, required: bool = False) -> Any:
        value = self._get(key, required, None)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    if isinstance(value, (list, dict, tuple)):
        return f"{type(value).__name__} of {len(value)} items"
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def check_int(value: Any, low: int | None, high: int | None, fail) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(f"expected an integer, got {_kind(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        fail(f"expected an integer in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}], got {value}")
    return int(value)


def check_float(value: Any, low: float | None, high: float | None, fail, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"expected a number, got {_kind(value)}")
    value = float(value)
    if finite and not math.isfinite(value):
        fail(f"expected a finite number, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        fail(f"expected a number in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}], got {value}")
    return value


def check_setting(name: str, value: Any, *, integer: bool = False, low: float | None = None, high: float | None = None,
                  positive: bool = False, optional: bool = False, error: type[ExhumeError] = ConfigError) -> Any:
    """A setting given in code or on a command line, checked as a file's fields are (a number of the
    right kind, finite, in ``[low, high]``; ``positive``: also > 0; ``optional``: None allowed).

    One line naming the setting, e.g. ``lr: expected a finite number, got inf``.
    """
    if value is None and optional:
        return None

    def fail(what: str):
        raise error(f"{name}: {what}")

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)  # numpy integers too
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and not integer:
        value = float(value)
    if integer:
        return check_int(value, None if low is None else int(math.ceil(low)), None if high is None else int(high), fail)
    value = check_float(value, low, high, fail)
    if positive and not value > 0:
        fail(f"expected a number > 0, got {value}")
    return value
