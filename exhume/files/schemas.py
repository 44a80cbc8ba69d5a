"""Schemas of the JSON files and checkpoints exhume reads: types, ranges and sizes, one place.

metrics.json is read against its type instead (:class:`exhume.evaluation.metrics.Metrics`, a
:class:`~exhume.files.records.Record`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from exhume.errors import DataError, ExhumeError, VictimError
from exhume.files.fields import Fields, check_float, check_int
from exhume.files.jsonio import read_json

TASKS = ("binary", "multiclass", "regression")
MAX_DIM = 65_536
MAX_INPUT_NUMBERS = 1 << 24
MAX_N = 10_000_000


def check_arch(arch: Any, source: str) -> dict[str, Any]:
    """An architecture spec dict: integer widths (never truncated floats), finite options."""
    f = Fields(arch, source, VictimError, "arch.")
    f.str("type", max_len=32)
    for key in ("widths", "channels"):
        f.int_list(key, low=1, high=1 << 20, required=False, min_len=1)
    f.int_list("fc", low=1, high=1 << 20, required=False, min_len=0)
    f.int("kernel", low=1, high=63, required=False)
    f.float("init", low=0.0, high=1e6, required=False)
    f.float("dropout", low=0.0, high=1.0, required=False)
    f.float("slope", low=-1e3, high=1e3, required=False)
    for key in ("pool", "bias"):
        v = arch.get(key)
        if v is not None and not isinstance(v, str) and not (key == "bias" and isinstance(v, list) and all(isinstance(b, bool) for b in v)):
            f.fail(key, f"expected a string{' or a list of true/false' if key == 'bias' else ''}, got {type(v).__name__}")
    return arch


def check_data_spec(spec: Any, source: str) -> dict[str, Any]:
    f = Fields(spec, source, DataError, "data_spec.")
    f.str("dataset", max_len=64)
    f.str("task", max_len=256)
    f.int("n", low=1, high=MAX_N)
    f.int("seed", required=False)
    f.int("size", low=0, high=MAX_N, required=False)
    f.int("num_classes", low=1, high=100_000, required=False)
    for key in ("root", "split", "kind", "target"):
        f.str(key, required=False)
    f.int_list("exclude", low=0, required=False, max_len=MAX_N)
    return spec


def check_victim_meta(meta: Any, source: str) -> dict[str, Any]:
    """victim.json: the fields :func:`exhume.victim.load_victim` uses, typed and in range."""
    f = Fields(meta, source, VictimError)
    f.int("format_version", low=1, high=1, required=False)
    check_arch(f.object("arch", required=True), source)
    task = f.str("task", choices=TASKS)
    shape = f.int_list("input_shape", low=1, high=MAX_DIM, min_len=1, max_len=4)
    if math.prod(shape) > MAX_INPUT_NUMBERS:
        f.fail("input_shape", f"expected at most {MAX_INPUT_NUMBERS} numbers per input, got {math.prod(shape)}")
    f.int("num_classes", low=2, high=100_000, required=task == "multiclass")
    f.str("loss", required=False, max_len=64)
    f.float("weight_decay", low=0.0, high=1e6, required=False)
    f.object("train_config")
    f.object("metrics")
    if meta.get("data_spec") is not None:
        check_data_spec(f.object("data_spec"), source)
    return meta


def read_victim_meta(path: Path) -> dict[str, Any]:
    return check_victim_meta(read_json(path, VictimError, "the victim.json written by 'exhume train'"), str(path))


def read_reconstruction_meta(path: Path) -> dict[str, Any]:
    meta = read_json(path, ExhumeError, "the reconstruction.json written by 'exhume attack'")
    f = Fields(meta, str(path))
    f.str("method", max_len=64)
    f.object("config")
    f.int("seed", required=False)
    f.object("summary")
    f.str("victim_path", required=False)
    f.str("victim_fingerprint", required=False, max_len=64)
    f.list("loss_history")
    return meta


def check_reconstruction_tensors(tensors: dict, source: str) -> None:
    """reconstruction.safetensors: candidates (m, ...) finite, labels (m,), scores (m,) if present."""
    import torch

    for key in ("candidates", "labels"):
        if key not in tensors:
            raise ExhumeError(f"{source}: tensor {key!r} is missing; expected candidates and labels")
    c = tensors["candidates"]
    if c.ndim < 2 or c.shape[0] == 0 or not c.is_floating_point():
        raise ExhumeError(f"{source}: tensor 'candidates': expected floating-point images (m, ...), got {c.dtype} {tuple(c.shape)}")
    for key in ("labels", "scores"):
        t = tensors.get(key)
        if t is not None and tuple(t.shape[:1]) != (c.shape[0],):
            raise ExhumeError(f"{source}: tensor {key!r}: expected {c.shape[0]} values (one per candidate), got shape {tuple(t.shape)}")
    if not torch.isfinite(c).all():
        raise ExhumeError(f"{source}: tensor 'candidates' holds NaN/inf values; expected finite images")


def check_checkpoint(payload: Any, source: str, tensors: dict, optimizers: dict, max_iteration: int | None) -> dict[str, Any]:
    """A checkpoint's structure: tensors and optimiser states present, progress in range."""
    import torch

    f = Fields(payload, source)
    saved, opts, state = f.sub("tensors"), f.sub("optimizers"), f.sub("state")
    for k in tensors:
        if not isinstance(saved.data.get(k), torch.Tensor):
            saved.fail(k, "missing or not a tensor")
    for k in optimizers:
        opts.object(k, required=True)
    state.int("iteration", low=0, high=max_iteration)
    state.float("elapsed", low=0.0)
    state.list("history", required=True)
    return state.data


__all__ = ["check_arch", "check_checkpoint", "check_data_spec", "check_float", "check_int", "check_victim_meta",
           "read_reconstruction_meta", "read_victim_meta"]
