"""One progress display for loops bounded by an iteration count, a wall-clock budget, or both.

On a terminal it is a tqdm bar. When a time budget is set the bar counts seconds (so its ETA is
honest even if the iteration limit is far away) and shows the iteration in its postfix; otherwise
it counts iterations. When stderr is not a terminal (a log file, CI), it writes one plain line at
most every ``LOG_INTERVAL`` seconds (and one at the end) instead of redrawing a bar.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

LOG_INTERVAL = 10.0


class Progress:
    def __init__(self, desc: str, iterations: int, max_seconds: float | None, start: int = 0,
                 elapsed: float = 0.0, unit: str = "it", disable: bool = False) -> None:
        self.by_time = max_seconds is not None
        self.unit, self.desc, self.total, self.max_seconds = unit, desc, iterations, max_seconds
        self.t0 = time.perf_counter() - elapsed
        self.iteration = start
        self.postfix: dict[str, str] = {}
        self.plain = not disable and not _is_terminal()
        self.disabled = disable
        self.bar = None
        if self.plain or disable:
            self.logged = time.perf_counter()
        elif self.by_time:
            self.bar = tqdm(total=round(float(max_seconds), 1), initial=round(elapsed, 1), desc=desc, unit="s",
                            mininterval=0.5, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=iterations, initial=start, desc=desc, unit=unit, mininterval=0.5)
        self.last = time.perf_counter()

    def update(self, iteration: int, **postfix: str) -> None:
        if postfix:
            self.postfix = postfix
        self.iteration = iteration
        if self.bar is None:
            if self.plain and time.perf_counter() - self.logged >= LOG_INTERVAL:
                self._line()
            return
        if not self.by_time:
            self.bar.update(1)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            return
        now = time.perf_counter()
        if now - self.last >= 0.5:
            self.bar.n = min(round(now - self.t0, 1), self.bar.total)
            self.bar.set_postfix({self.unit: iteration, **self.postfix}, refresh=False)
            self.bar.refresh()
            self.last = now

    def _line(self) -> None:
        self.logged = time.perf_counter()
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.unit} {self.iteration}/{self.total}, {self.clock(self.logged - self.t0)}{extra}",
              file=sys.stderr, flush=True)

    def clock(self, seconds: float) -> str:
        """``"12/17 s"``; past the budget ``"18 s (1 s over the 17-s budget)"``, never ``"18/17 s"``."""
        if not self.by_time:
            return f"{seconds:.0f} s"
        if f"{seconds:.0f}" == f"{self.max_seconds:.0f}" or seconds <= self.max_seconds:
            return f"{seconds:.0f}/{self.max_seconds:.0f} s"
        return f"{seconds:.0f} s ({seconds - self.max_seconds:.1f} s over the {self.max_seconds:.0f}-s budget)"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.plain:
            self._line()


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
