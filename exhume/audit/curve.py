"""A measured curve shipped with the package (the law's, differential privacy's), read at one point.

The reading is the nearest measured point when one lies within a factor ``same`` of the point asked about, else the
two measured points around it: never an extrapolation (the caller refuses a point outside the measured range first).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from exhume.errors import DataError
from exhume.files.jsonio import read_json


def load_curve(path: Path, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The curve in ``path`` (``what`` names it in an error), checked: a mapping with ``keys``, its ``points`` a list."""
    table = read_json(path, DataError, what=what)
    if not isinstance(table, dict) or any(k not in table for k in keys) or not isinstance(table["points"], list):
        raise DataError(f"{path}: expected {what} with {', '.join(keys)}")
    return table


def read_at(points: list[dict[str, Any]], key: str, x: float, same: float) -> tuple[list[int], list[float], str]:
    """The memorised fraction at ``key`` = ``x`` (``points`` sorted by ``key``, ``x`` within their range): the percents,
    low and high, the values of ``key`` they were measured at, and the percent in words (``"12 %"``, ``"8–15 %"``)."""
    near = [p for p in points if max(p[key], x) / min(p[key], x) <= same]
    if near:
        pair = [min(near, key=lambda p: abs(math.log(p[key] / x)))] * 2
    else:
        pair = [max((p for p in points if p[key] < x), key=lambda p: p[key]),
                min((p for p in points if p[key] > x), key=lambda p: p[key])]
    percent = sorted(round(100 * p["fraction"]) for p in pair)
    amount = f"{percent[0]} %" if percent[0] == percent[1] else f"{percent[0]}–{percent[1]} %"
    return percent, [p[key] for p in pair], amount
