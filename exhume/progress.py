"""One progress bar for loops bounded by an iteration count, a wall-clock budget, or both.

When a time budget is set the bar counts seconds (so its ETA is honest even if the iteration
limit is far away) and shows the iteration in its postfix; otherwise it counts iterations.
"""

from __future__ import annotations

import time

from tqdm.auto import tqdm


class Progress:
    def __init__(self, desc: str, iterations: int, max_seconds: float | None, start: int = 0,
                 elapsed: float = 0.0, unit: str = "it", disable: bool = False) -> None:
        self.by_time = max_seconds is not None
        self.unit = unit
        self.t0 = time.perf_counter() - elapsed
        if self.by_time:
            self.bar = tqdm(total=round(float(max_seconds), 1), initial=round(elapsed, 1), desc=desc, unit="s",
                            disable=disable, mininterval=0.5, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=iterations, initial=start, desc=desc, unit=unit, disable=disable, mininterval=0.5)
        self.last = time.perf_counter()
        self.postfix: dict[str, str] = {}

    def update(self, iteration: int, **postfix: str) -> None:
        if postfix:
            self.postfix = postfix
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

    def close(self) -> None:
        self.bar.close()
