"""``-p key=value`` attack parameters from the command line (values read as JSON where they parse), and restarts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from exhume.errors import ConfigError


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def parse_restarts(value: int | str | None, name: str = "restarts") -> int | str | None:
    """A number of restarts as given: a positive integer (or its digits), ``"auto"``, or None (the default)."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} expects a positive integer or 'auto', got {value!r}")
    return value


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param expects key=value, got {pair!r}")
        out[key.strip().replace("-", "_")] = parse_value(value.strip())
    return out
