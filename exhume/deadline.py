"""One wall-clock deadline, made where a command or call begins and handed down explicitly.

A :class:`Deadline` is an instant on ``time.time()``'s clock (so spawned worker processes, which
receive it pickled, share it), or none, with the seconds it stood for when it was made (``seconds``:
what the entry point asked, the number a record and the settings-based rules read, never the clock).
Each layer takes a sub-deadline of the one it was given: the audit keeps its judging's reserve, the
portfolio its pooling's and gives each wave of restarts its share, a restart runs to its wave's end.
An attack's loop stops once its deadline has passed (the last complete step is kept).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from exhume.errors import ConfigError


def _seconds(what: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Deadline:
    """``at``: the ``time.time()`` instant a run must end by (None: never); ``seconds``: the budget it was made with."""

    at: float | None = None
    seconds: float | None = None

    @classmethod
    def never(cls) -> Deadline:
        return cls()

    @classmethod
    def after(cls, seconds: float | None, since: float | None = None) -> Deadline:
        """``seconds`` from ``since`` (a ``time.time()`` value, e.g. the process's start; default now); None: never."""
        if seconds is None:
            return cls()
        seconds = _seconds("a deadline's seconds", seconds)
        return cls((time.time() if since is None else float(since)) + seconds, seconds)

    @property
    def bounded(self) -> bool:
        return self.at is not None

    def left(self) -> float | None:
        """Seconds until the deadline (0 once passed); None when there is none."""
        return None if self.at is None else max(0.0, self.at - time.time())

    def passed(self) -> bool:
        return self.at is not None and time.time() >= self.at

    def spent(self) -> float:
        """Seconds since the budget began (``seconds`` less what is left; 0 without a deadline)."""
        return 0.0 if self.at is None else float(self.seconds) - self.left()

    def sooner(self, seconds: float | None) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now (None: this one)."""
        if seconds is None:
            return self
        mine = Deadline.after(seconds)
        if self.at is None or mine.at < self.at:
            return mine
        return Deadline(self.at, min(self.seconds, mine.seconds))  # a run under it is no longer than either

    def at_least(self, seconds: float) -> Deadline:
        """The later of this deadline and ``seconds`` from now: a share that must not shrink below ``seconds``."""
        mine = Deadline.after(seconds)
        return self if self.at is None or self.at >= mine.at else mine

    def share(self, fraction: float) -> Deadline:
        """``fraction`` (in [0, 1]) of the time left, from now."""
        if not 0.0 <= _seconds("a deadline's share", fraction) <= 1.0:
            raise ConfigError(f"a deadline's share must be in [0, 1], got {fraction!r}")
        return self if self.at is None else Deadline.after(self.left() * fraction)

    def later(self, seconds: float) -> Deadline:
        """This deadline ``seconds`` later: time not charged to a run (its caller's callback, :func:`~exhume.attacks.engine.loop.run_loop`)."""
        seconds = _seconds("a deadline's delay", seconds)
        return self if self.at is None else Deadline(self.at + seconds, self.seconds + seconds)

    def reserve(self, seconds: float) -> Deadline:
        """This deadline less ``seconds`` kept for what comes after (the pooling, the judging)."""
        seconds = _seconds("a deadline's reserve", seconds)
        return self if self.at is None else Deadline(self.at - seconds, max(0.0, self.seconds - seconds))


#: no deadline: the default of every ``deadline=`` keyword (a Deadline is frozen, so one instance serves them all)
NEVER = Deadline()
