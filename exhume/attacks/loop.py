"""The optimisation loop every attack shares: progress, time budget, logging cadence, checkpoints
(every K steps, on Ctrl-C and at the end) and a user callback whose time is not counted.

An attack supplies ``step(it, log, clock)``, which performs iteration ``it``, appends its own
history record when ``log`` is true (``clock()`` gives the attack seconds so far) and returns the
progress-bar postfix (or None); ``save(done, elapsed)`` writes a checkpoint; ``emit(it, elapsed)``
calls the user's callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from exhume.progress import Progress


@dataclass
class LoopEnd:
    done: int  # the last iteration whose update is complete
    elapsed: float  # attack seconds, callbacks excluded, resumed runs included


def run_loop(desc: str, total: int, max_seconds: float | None, start: int, elapsed0: float,
             step: Callable[[int, bool, Callable[[], float]], dict[str, str] | None],
             save: Callable[[int, float], None], *, log_every: int, checkpoint_every: int, progress: bool = True,
             emit: Callable[[int, float], None] | None = None, emit_every: int = 1000) -> LoopEnd:
    t0 = time.perf_counter()
    paused = 0.0

    def clock() -> float:
        return elapsed0 + time.perf_counter() - t0 - paused

    done = last_saved = start
    bar = Progress(desc, total, max_seconds, start, elapsed0, disable=not progress)
    try:
        for it in range(start + 1, total + 1):
            log = it % log_every == 0 or it == 1
            postfix = step(it, log, clock)
            done = it
            elapsed = clock()
            bar.update(it, **(postfix or {}))
            if it % checkpoint_every == 0:
                save(done, elapsed)
                last_saved = done
            if emit is not None and it % emit_every == 0:
                pause = time.perf_counter()
                emit(it, elapsed)
                paused += time.perf_counter() - pause
            if max_seconds is not None and elapsed >= max_seconds:
                break
    except KeyboardInterrupt:
        save(done, clock())  # an interrupted run loses nothing: --resume continues from here
        raise
    finally:
        bar.close()
    if done != last_saved:  # the last periodic checkpoint may already be the final one
        save(done, clock())
    return LoopEnd(done=done, elapsed=clock())
