"""Steps that an interrupt cannot cut in half.

A long loop (victim training, an attack) checkpoints when it is interrupted (Ctrl-C, SIGTERM, the
end of a chunk: each raises a KeyboardInterrupt where the program is). If the interrupt lands
between an update of the parameters and the counter that says the update happened, the
checkpoint records the new parameters under the old step and a resumed run applies that step
twice. :func:`whole_step` holds SIGINT, SIGTERM and SIGALRM for the length of one step and
delivers a signal that arrived meanwhile right after it, where the state is consistent. It costs
six ``signal.signal`` calls per step (microseconds) and does nothing outside the main thread,
where Python delivers no signals anyway. :func:`let_through` opens a block inside it where
interrupts arrive as usual: bookkeeping held whole around a long interruptible part (a tuning
trial between Optuna's own steps, which an interrupt would leave half done).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HELD = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None), getattr(signal, "SIGALRM", None))
             if s is not None)
#: the open :func:`whole_step` blocks, innermost last: the handlers each replaced, the signals it holds, its holder
_HOLDS: list[tuple[dict, list[int], Callable]] = []


@contextmanager
def whole_step() -> Iterator[None]:
    """Run the block with interrupts held; a signal that arrived meanwhile is delivered after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum, frame) -> None:
        arrived.append(signum)

    previous: dict = {}
    _HOLDS.append((previous, arrived, hold))
    try:
        for s in HELD:
            previous[s] = signal.signal(s, hold)
        yield
    finally:
        _HOLDS.pop()
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        for s in dict.fromkeys(arrived):  # each signal once, in the order it came, to its own handler
            signal.raise_signal(s)


@contextmanager
def let_through() -> Iterator[None]:
    """Inside :func:`whole_step`: run the block with the handlers it replaced, as outside it (a signal it held so
    far arrives first); the hold resumes after the block. Outside one, or outside the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread() or not _HOLDS:
        yield
        return
    previous, arrived, hold = _HOLDS[-1]
    try:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        pending = list(dict.fromkeys(arrived))
        arrived.clear()
        for s in pending:
            signal.raise_signal(s)
        yield
    finally:
        for s in previous:
            signal.signal(s, hold)
