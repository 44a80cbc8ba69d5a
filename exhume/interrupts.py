"""Steps that an interrupt cannot cut in half.

A long loop (victim training, an attack) checkpoints when it is interrupted (Ctrl-C, SIGTERM, the
end of a chunk: each raises a KeyboardInterrupt where the program is). If the interrupt lands
between an update of the parameters and the counter that says the update happened, the
checkpoint records the new parameters under the old step and a resumed run applies that step
twice. :func:`whole_step` holds SIGINT, SIGTERM and SIGALRM for the length of one step and
delivers a signal that arrived meanwhile right after it, where the state is consistent. It costs
six ``signal.signal`` calls per step (microseconds) and does nothing outside the main thread,
where Python delivers no signals anyway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HELD = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None), getattr(signal, "SIGALRM", None))
             if s is not None)


@contextmanager
def whole_step() -> Iterator[None]:
    """Run the block with interrupts held; a signal that arrived meanwhile is delivered after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum, frame) -> None:
        arrived.append(signum)

    previous = {}
    try:
        for s in HELD:
            previous[s] = signal.signal(s, hold)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        for s in dict.fromkeys(arrived):  # each signal once, in the order it came, to its own handler
            signal.raise_signal(s)
