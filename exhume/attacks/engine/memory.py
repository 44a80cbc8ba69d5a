"""Memory known before the first step: an attack's peak estimate, the memory available, one-line refusals.

Every attack answers :meth:`~exhume.attacks.engine.base.Attack.peak_memory_bytes` from the victim's
shapes, its candidate count and its dtype, before it allocates anything: the parameter count
``P``, the input size ``D`` and the activations one input creates in a forward pass (``A``,
counted by :func:`activation_elements` on one and two inputs, so any ``nn.Module`` is measured
as it runs), times coefficients measured against ``/usr/bin/time``'s maximum resident set
(``benchmarks/memory_estimate.py``; the table: ``docs/defaults.md#constants-memory-estimate``). The estimate is
what the attack adds to the process, not the interpreter and torch already loaded.

:func:`check_memory` compares it with the memory available to this process (``MemAvailable``
in ``/proc/meminfo``, capped by the cgroup's limit, as on a cluster's job; a CUDA device's free
memory) and refuses in one line naming the estimate and the settings that would fit (fewer
candidates, float32, fewer workers, ...) from the attack's :attr:`memory_knobs`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from exhume.errors import ConfigError

MiB = 1 << 20


class MemoryRefused(ConfigError):
    """An attack whose estimated peak memory exceeds what the machine has available."""


@dataclass(frozen=True)
class Activations:
    """Elements a forward pass creates: ``per_input`` for each input, ``fixed`` once per pass."""

    per_input: int
    fixed: int


class _Count(TorchDispatchMode):
    """Counts the elements of every tensor an operation creates (views, which share storage, excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            shared = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)} - {None}
            self.elements += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _storage(t) not in shared)
        return out


def _storage(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage (None on the meta device, where tensors have none)."""
    return None if t.device.type == "meta" else t.untyped_storage().data_ptr()


_COUNTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {input shape: Activations}


def activation_elements(model: torch.nn.Module, input_shape: tuple[int, ...]) -> Activations:
    """Elements created by ``model``'s forward pass on one input and on two (no gradients, eval mode,
    on the model's own device and dtype); the difference is what each further input adds. Counted
    once per model and shape (the advice of a refusal asks again for each setting it tries)."""
    known = _COUNTED.setdefault(model, {})
    if tuple(input_shape) not in known:
        known[tuple(input_shape)] = _count(model, tuple(input_shape))
    return known[tuple(input_shape)]


def _count(model: torch.nn.Module, input_shape: tuple[int, ...]) -> Activations:
    p = next(iter(model.parameters()), None)
    device, dtype = (p.device, p.dtype) if p is not None else (torch.device("cpu"), torch.float32)
    try:
        return counted(model, model, lambda batch: torch.zeros(batch, *input_shape, device=device, dtype=dtype))
    except Exception as e:  # noqa: BLE001 - a module that cannot run on inputs of its stated shape: one line
        raise ConfigError(f"the victim's model failed on inputs of its input shape {tuple(input_shape)} ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); expected a module taking (N, {', '.join(map(str, input_shape))})") from None


def counted(model: torch.nn.Module, forward: Callable[[Any], Any], inputs: Callable[[int], Any] = lambda batch: batch) -> Activations:
    """:class:`Activations` of ``forward(inputs(batch))`` (a pass of ``model``, set to eval mode meanwhile) at batches 1
    and 2; the inputs are made before counting starts."""
    counts = []
    was_training = model.training
    model.eval()
    try:
        for batch in (1, 2):
            given = inputs(batch)
            with torch.no_grad(), _Count() as count:
                forward(given)
            counts.append(count.elements)
    finally:
        model.train(was_training)
    per_input = max(counts[1] - counts[0], 0)
    return Activations(per_input=per_input, fixed=max(counts[0] - per_input, 0))


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def input_elements(view) -> int:
    return math.prod(view.input_shape)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2, else v1) still allows, or None without a limit."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            return max(int(limit) - usage, 0)
    return None


def available_bytes(device: str | torch.device = "cpu") -> int | None:
    """Memory this process can still allocate on ``device`` (None when unknown: not checked)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    if dev.type != "cpu":
        return None
    found = [v for v in (_meminfo_available(), _cgroup_room()) if v is not None]
    return min(found) if found else None


def gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= (1 << 30) else f"{n / MiB:.0f} MiB"


def check_memory(attack, view, device: str | torch.device = "cpu", copies: int = 1, what: str = "",
                 available: int | None = None) -> int | None:
    """Refuse (:class:`MemoryRefused`, one line) an attack whose estimated peak, times ``copies`` (parallel
    workers), exceeds the memory available; returns the estimate (None when the attack gives none)."""
    need = attack.peak_memory_bytes(view)
    if need is None:
        return None
    room = available_bytes(device) if available is None else available
    if room is None or need * copies <= room:
        return need
    fits = fitting_settings(attack, view, room // max(copies, 1))
    if copies > 1 and need <= room:
        fits.insert(0, f"--workers {room // need} (runs at once)")
    settings = ", ".join([f"{k}={attack.effective(view, k):,}" for k, kind in attack.memory_knobs.items() if kind == "count"]
                         + [str(attack.config.get("dtype", "float32"))])
    runs = f" ({copies} runs at once, {gib(need)} each)" if copies > 1 else ""
    raise MemoryRefused(f"the {attack.name} attack{what} needs about {gib(need * copies)} at its peak{runs}, estimated from the victim's "
                        f"{parameter_count(view.model):,} parameters and {input_elements(view):,} input values with {settings}, "
                        f"but {gib(room)} is available on {device}; "
                        + ("settings that fit: " + "; ".join(fits) if fits else "no setting of this attack fits: use a machine with more memory"))


def fitting_settings(attack, view, room: int) -> list[str]:
    """Changes of ``attack.memory_knobs`` that bring its estimate under ``room`` bytes: float32 for float64, another
    choice, or the largest count that fits (in the present dtype, and in float32 when the attack runs in float64)."""
    out: list[str] = []
    dtypes = [{}] + ([{"dtype": "float32"}] if attack.memory_knobs.get("dtype") == "dtype" and attack.config.get("dtype") == "float64"
                     else [])
    for name, kind in attack.memory_knobs.items():
        value = attack.config.get(name)
        if kind == "dtype" and dtypes[1:]:
            est = _with(attack, view, {"dtype": "float32"})
            if est <= room:
                out.append(f"-p dtype=float32 (about {gib(est)})")
        elif isinstance(kind, tuple) and value in kind:  # a choice: the others that fit
            out += [f"-p {name}={alt} (about {gib(e)})" for alt in kind if alt != value
                    for e in [_with(attack, view, {name: alt})] if e <= room]
        elif kind == "count":
            current = attack.effective(view, name)
            for change in dtypes:
                best = _largest_fitting(attack, view, name, current, room, change)
                if best:
                    flags = "".join(f"-p {k}={v} " for k, v in change.items())
                    out.append(f"{flags}-p {name}={best} (about {gib(_with(attack, view, {**change, name: best}))}; now {current:,})")
    return out


def _with(attack, view, change: dict[str, Any]) -> int:
    other = type(attack)(**{**attack.config, **change})
    return other.peak_memory_bytes(view)


def _largest_fitting(attack, view, name: str, current: int, room: int, change: dict[str, Any]) -> int | None:
    """The largest count below ``current`` whose estimate (with ``change``) fits ``room``: estimates grow with the count."""
    low = int(attack.params[name].low or 1)
    if current <= low or _with(attack, view, {**change, name: low}) > room:
        return None
    lo, hi = low, current - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _with(attack, view, {**change, name: mid}) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def generic_peak(attack, view) -> int:
    """A rough bound for an attack that gives no estimate of its own: three copies of the parameters and,
    for each of its candidates (``m``, ``batch_size``, else the training-set size guess), eight copies of
    its input and three of the activations it creates, in its dtype (float32 unless ``dtype`` says)."""
    cfg = attack.config
    count = cfg.get("m") or cfg.get("batch_size") or getattr(view, "n_train_hint", None) or 100
    size = 8 if cfg.get("dtype") == "float64" else 4
    acts = activation_elements(view.model, tuple(view.input_shape))
    return size * (3 * parameter_count(view.model) + int(count) * (8 * input_elements(view) + 3 * acts.per_input) + acts.fixed)


#: bytes every attack adds whatever its size (allocator arenas, modules imported on first use), measured
BASE_BYTES = 24 * MiB


def dtype_bytes(name: str | None) -> int:
    return 8 if name == "float64" else 4
