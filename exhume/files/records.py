"""Typed records written as one flat JSON object: the schema a file is read with comes from the type.

A record is a dataclass subclassing :class:`Record` whose fields are declared with :func:`entry`
(or :func:`count`): the JSON key each is written under, its range, and when it is written. The
field's annotation gives its type (``int``, ``float``, ``str``, ``bool``, ``list[...]``,
``dict[...]``; ``| None`` for a value that may be null), so adding a field to the file is one
line in the dataclass: writing, reading and checking follow. Keys no field declares are kept in
``extra`` and written last, so a file keeps whatever a caller added.

A record is also a mutable mapping keyed by the JSON keys (``record["memorised"]``,
``record["ssim>=0.4"] = 3``), the same mapping the file holds, so code that used the plain dict
keeps working.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from exhume.errors import ExhumeError
from exhume.files.fields import Fields, check_float, check_int
from exhume.files.jsonio import finite_or_null, read_json, write_json

MAX_COUNT = 10_000_000
_NUMBER = r"([0-9][0-9.eE+-]*)"
_KINDS = {int: "int", float: "float", str: "str", bool: "bool", dict: "dict", list: "list"}


def entry(key: str | None = None, *, low: float | None = None, high: float | None = None, at_most: str | None = None,
          choices: tuple[str, ...] | None = None, group: str | None = None, omit_none: bool = False,
          pattern: str | None = None, required: bool = False, max_len: int = 1 << 16) -> Any:
    """A record field, None by default.

    ``key``: its JSON key (default: the field's name). ``low``/``high``: its range (for a list or a
    dict, each item's). ``at_most``: the key of the field it cannot exceed. ``choices``: the strings
    it may take. ``group``: written only when some field of the same group is set (fields without
    a group are always written). ``omit_none``: not written while None (else written as null).
    ``pattern``: for a ``dict[float, int]``, written as one key per threshold,
    ``pattern.format(f"{t:g}")``. ``required``: a file without it is refused.
    """
    meta = {"key": key, "low": low, "high": high, "at_most": at_most, "choices": choices, "group": group,
            "omit_none": omit_none, "pattern": pattern, "required": required, "max_len": max_len}
    return dataclasses.field(default=None, metadata={"record": meta})


def count(key: str | None = None, **kwargs) -> Any:
    """A non-negative integer field (a count), at most ``MAX_COUNT``; see :func:`entry`."""
    return entry(key, low=0, high=MAX_COUNT, **kwargs)


@dataclasses.dataclass(frozen=True)
class _Slot:
    name: str
    key: str
    kind: str
    item: str | None  # the kind of a list's items or a dict's values
    meta: dict

    def threshold_key(self, t: float) -> str:
        return self.meta["pattern"].format(f"{t:g}")


def _kind(tp: Any, where: str) -> tuple[str, str | None]:
    """``(kind, item kind)`` of an annotation, ``X | None`` read as ``X``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{where}: one type (or one type | None) expected, got {tp}")
        tp = args[0]
    origin = typing.get_origin(tp) or tp
    if origin not in _KINDS:
        raise TypeError(f"{where}: a record field is int, float, str, bool, list or dict, got {tp}")
    args = typing.get_args(tp)
    item = args[-1] if args else None
    return _KINDS[origin], (_KINDS.get(typing.get_origin(item) or item) if item is not None else None)


_LAYOUTS: dict[type, tuple[_Slot, ...]] = {}


def layout(cls: type) -> tuple[_Slot, ...]:
    """The record class's fields in the order they are written (``extra`` aside)."""
    if cls not in _LAYOUTS:
        hints = typing.get_type_hints(cls)
        slots = []
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            if "record" not in f.metadata:
                raise TypeError(f"{cls.__name__}.{f.name}: declare record fields with entry() or count()")
            meta = f.metadata["record"]
            kind, item = _kind(hints[f.name], f"{cls.__name__}.{f.name}")
            if meta["pattern"] is not None and (kind, item) != ("dict", "int"):
                raise TypeError(f"{cls.__name__}.{f.name}: a pattern field is a dict[float, int]")
            slots.append(_Slot(f.name, meta["key"] or f.name, "thresholds" if meta["pattern"] else kind, item, meta))
        _LAYOUTS[cls] = tuple(slots)
    return _LAYOUTS[cls]


def plain(v: Any) -> Any:
    """``v`` with numpy (or torch) scalars and arrays as Python numbers and lists, tuples as lists, keys as strings."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or type(v) in (bool, int, float, str):
        return v
    if hasattr(v, "tolist"):  # numpy arrays and scalars (np.float64 included), tensors
        return plain(v.tolist())
    return v


def jsonable(v: Any) -> Any:
    """:func:`plain`, with every NaN/inf as None (JSON has no such numbers)."""
    return finite_or_null(plain(v))


class Record(MutableMapping):
    """Base of a typed record (a dataclass with ``extra: dict`` last); see the module docstring."""

    extra: dict[str, Any]
    WHAT = "a record"  # what the file is, for messages ("the metrics.json written by 'exhume evaluate'")

    # ---- the JSON object ----
    def to_dict(self) -> dict[str, Any]:
        """The JSON object (values shared, not copied), in the order of the fields, ``extra`` last."""
        slots = layout(type(self))
        groups = {s.meta["group"] for s in slots if s.meta["group"] and getattr(self, s.name) is not None}
        out: dict[str, Any] = {}
        for s in slots:
            value = getattr(self, s.name)
            if (s.meta["group"] and s.meta["group"] not in groups) or (value is None and (s.meta["omit_none"] or s.kind == "thresholds")):
                continue
            if s.kind == "thresholds":
                out.update((s.threshold_key(t), c) for t, c in value.items())
            else:
                out[s.key] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "a record", error: type[ExhumeError] = ExhumeError):
        """``data`` checked against the type (one line naming ``source`` and the field on the first fault)."""
        f = Fields(data, source, error)
        by_key = {s.key: s for s in layout(cls) if s.kind != "thresholds"}
        values: dict[str, Any] = {}
        for s in by_key.values():
            values[s.name] = _read(f, s)
        extra = {}
        for key, value in data.items():
            if key in by_key:
                continue
            hit = _threshold_of(cls, key)
            if hit is None:
                extra[key] = value
                continue
            slot, t = hit
            if t is None:
                f.fail(key, "expected a threshold written like 0.4 after '>='")
            if value is not None:
                values.setdefault(slot.name, {})[t] = check_int(value, slot.meta["low"], slot.meta["high"], lambda w, k=key: f.fail(k, w))
        record = cls(**values, extra=extra)
        record._check_limits(f)
        return record

    @classmethod
    def from_mapping(cls, data: Any):
        """A record holding ``data``'s keys as they are (no checks: for a dict built in memory)."""
        record = cls(extra={})
        for key, value in dict(data).items():
            record[key] = value
        return record

    @classmethod
    def read(cls, path: str | Path, error: type[ExhumeError] = ExhumeError):
        """Read and check ``path`` (JSON with size and depth limits; ``cls.WHAT`` names the file in messages)."""
        return cls.from_dict(read_json(path, error, cls.WHAT), str(path), error)

    def write(self, path: str | Path) -> Path:
        """Write the record atomically, after checking it as it will be read back."""
        data = jsonable(self.to_dict())
        type(self).from_dict(data, f"{path} (being written)")
        write_json(path, data)
        return Path(path)

    def _check_limits(self, f: Fields) -> None:
        by_key = {s.key: s for s in layout(type(self))}
        for s in layout(type(self)):
            limit_key, value = s.meta["at_most"], getattr(self, s.name)
            if limit_key is None or value is None:
                continue
            limit = getattr(self, by_key[limit_key].name) or 0
            items = value.items() if s.kind == "thresholds" else [(None, value)]
            for t, v in items:
                if v > limit:
                    key = s.key if t is None else s.threshold_key(t)
                    f.fail(key, f"expected at most {limit_key} = {limit}, got {v}")

    # ---- the mapping ----
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        slot = _slot_of(type(self), key)
        if slot is not None:
            setattr(self, slot.name, value)
            return
        hit = _threshold_of(type(self), key)
        if hit is not None and hit[1] is not None:
            slot, t = hit
            counts = getattr(self, slot.name)
            if counts is None:
                counts = {}
                setattr(self, slot.name, counts)
            counts[t] = value
            return
        self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self.to_dict():
            raise KeyError(key)
        slot = _slot_of(type(self), key)
        if key in self.extra:
            del self.extra[key]
        elif slot is not None:
            setattr(self, slot.name, None)
        else:
            slot, t = _threshold_of(type(self), key)
            del getattr(self, slot.name)[t]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


def _slot_of(cls: type, key: str) -> _Slot | None:
    return next((s for s in layout(cls) if s.kind != "thresholds" and s.key == key), None)


def _threshold_of(cls: type, key: str) -> tuple[_Slot, float | None] | None:
    """The pattern field ``key`` belongs to and its threshold (None when written otherwise than ``f"{t:g}"``)."""
    if _slot_of(cls, key) is not None:
        return None
    for s in layout(cls):
        if s.kind != "thresholds":
            continue
        prefix, _, suffix = s.meta["pattern"].partition("{}")
        hit = re.fullmatch(re.escape(prefix) + _NUMBER + re.escape(suffix), key)
        if hit:
            try:
                t = float(hit.group(1))
            except ValueError:
                return s, None
            return s, (t if s.threshold_key(t) == key else None)
    return None


def _read(f: Fields, s: _Slot) -> Any:
    """The checked value of one (non-pattern) field, None when absent or null."""
    m, key = s.meta, s.key
    req = m["required"]
    if s.kind == "int":
        return f.int(key, m["low"], m["high"], required=req)
    if s.kind == "float":
        return f.float(key, m["low"], m["high"], required=req)
    if s.kind == "str":
        return f.str(key, m["choices"], required=req, max_len=m["max_len"])
    if s.kind == "bool":
        value = f.data.get(key)
        if value is not None and not isinstance(value, bool):
            f.fail(key, f"expected true or false, got {type(value).__name__}")
        return value
    value = f.object(key, required=req) if s.kind == "dict" else f.list(key, required=req)
    if value is not None and s.item in ("int", "float", "str"):
        items = value.items() if s.kind == "dict" else enumerate(value)
        for i, v in items:
            _item(v, s, lambda what, i=i: f.fail(key, f"item {i!r}: {what}"))
    return value


def _item(v: Any, s: _Slot, fail) -> None:
    if s.item == "int":
        check_int(v, s.meta["low"], s.meta["high"], fail)
    elif s.item == "float":
        check_float(v, s.meta["low"], s.meta["high"], fail)
    elif not isinstance(v, str):
        fail(f"expected a string, got {type(v).__name__}")
