"""Keep freed memory in the process while an attack runs (glibc's malloc), for speed on CPU.

A step of an attack on a CNN allocates and frees tens of activation-sized tensors (10 MB each for
200 candidates of a 16-channel 28×28 convolution). With its default settings glibc hands such
blocks back to the operating system when they are freed (``munmap``, or trimming the heap's top),
and the next allocation pays a page fault for every page it touches: about a third of a CNN step
on this project's machines (``docs/defaults.md#constants-retained-heap``). Inside
:func:`retained_heap` blocks up to 32 MiB come from the heap and the heap is not trimmed, so freed
pages are reused; on leaving it the heap is trimmed once, and later trimmed above 64 MiB of free
top. The process's peak memory is that of the run (pages are kept, not added). Where the C library
is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_AFTER = 64 << 20  # free heap top kept once a run is over


@cache
def glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc (it has ``gnu_get_libc_version`` and ``mallopt``), else None."""
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    return lib if all(hasattr(lib, f) for f in ("gnu_get_libc_version", "mallopt", "malloc_trim")) else None


@contextmanager
def retained_heap() -> Iterator[None]:
    """Freed blocks up to 32 MiB stay in the process inside this block (glibc; a no-op elsewhere)."""
    lib = glibc()
    if lib is None:
        yield
        return
    lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    lib.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        lib.mallopt(M_TRIM_THRESHOLD, TRIM_AFTER)
        lib.malloc_trim(0)
