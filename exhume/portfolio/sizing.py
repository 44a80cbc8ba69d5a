"""How many restarts a time budget buys, from the attack's measured iteration rate.

A fixed restart length does not transfer between victims: the same seconds are many times more kkt
iterations on a small victim than on a 1000-1000 one, where they can be too few to leave the data mean. So
``restarts="auto"`` with a time budget first **probes** the attack: one short run (``PROBE_SHARE`` of the budget, between
``PROBE_SECONDS``), in this process, at the thread count a restart will get (one thread for
forked parallel workers, see :mod:`exhume.portfolio.runner`), discarded afterwards. Its wall
time, set-up included, is taken from the budget. From the measured rate :func:`choose` then
decides:

- restarts get about ``MIN_ITERATIONS_PER_RESTART`` iterations each or more (expected at the
  probe's rate × ``PARALLEL_EFFICIENCY`` when workers share the machine; the number of waves this
  allows is rounded to the nearest, so a restart gets at least 3/4 of it) and about
  ``SECONDS_PER_RESTART`` seconds each (the number of waves rounded) where the rate allows more.
  Rounded rather than floored: two shorter restarts found more than one twice as long;
- when even one wave of parallel restarts would leave each below that floor, and the caller did
  not fix the number of workers, the budget goes to **one run with all the cores**.

The decision and the measurement are kept in ``config["portfolio"]["sizing"]``; a resumed
portfolio reuses the stored decision (``OUT/restarts/sizing.json``) instead of probing again, so
that its finished restarts still match the plan. The measurements behind the constants:
``docs/defaults.md#portfolio-iterations-per-restart`` and the rows beside it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from exhume.deadline import Deadline
from exhume.errors import DivergenceError, ExhumeError
from exhume.portfolio.variants import MAX_AUTO_RESTARTS, SECONDS_PER_RESTART, restart_plan

MIN_ITERATIONS_PER_RESTART = 2000  # for an attack whose restart plan does not say (measured with kkt)
PROBE_SHARE = 0.03
PROBE_SECONDS = (1.0, 5.0)
# Iterations per second of one restart among parallel workers, over the same restart alone (the
# probe runs alone): about 1 where measured, less here for machines whose cores share less well.
PARALLEL_EFFICIENCY = 0.95
SIZING_FILE = "sizing.json"


@dataclass(frozen=True)
class Sizing:
    restarts: int
    workers: int
    seconds: float  # the budget left for the restarts (the deadline's seconds less the probe)
    rate: float | None  # measured iterations per second of one restart, alone, at `threads`
    threads: int
    probe_seconds: float
    expected_iterations: int | None  # per restart, as planned
    reason: str

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Sizing:
        return cls(int(rec["restarts"]), int(rec["workers"]), float(rec["seconds"]), rec.get("rate"), int(rec["threads"]),
                   float(rec["probe_seconds"]), rec.get("expected_iterations"), str(rec["reason"]))


def choose(budget: float, rate: float, workers: int, *, fixed_workers: bool = False,
           min_iterations: int = MIN_ITERATIONS_PER_RESTART, seconds_per_restart: float = SECONDS_PER_RESTART,
           max_restarts: int = MAX_AUTO_RESTARTS, efficiency: float = PARALLEL_EFFICIENCY) -> tuple[int, int, str]:
    """``(restarts, workers, reason)`` for ``budget`` seconds at ``rate`` iterations/s of one restart alone."""
    workers = max(1, int(workers))
    eff = efficiency if workers > 1 else 1.0
    per_wave = budget * rate * eff  # iterations of each restart if the whole budget is one wave
    if per_wave < min_iterations and workers > 1 and not fixed_workers:
        return 1, 1, (f"one run on all cores: {workers} parallel restarts would get ~{per_wave:.0f} iterations each "
                      f"(< {min_iterations})")
    waves_time = round(budget / seconds_per_restart)  # rounded: the probe's few seconds must not drop a wave
    waves_iter = math.floor(per_wave / min_iterations + 0.5)  # the nearest, halves up
    waves = max(1, min(waves_time, waves_iter))
    restarts = max(1, min(workers * waves, max_restarts))
    bound = "iterations" if waves_iter < waves_time else "seconds"
    why = (f"{waves} wave(s) of {workers}: each restart about {min_iterations} iterations" if bound == "iterations"
           else f"{waves} wave(s) of {workers}: about {seconds_per_restart:g} s per restart")
    if waves == 1 and per_wave < min_iterations:
        why = f"one wave of {workers}: below {min_iterations} iterations per restart even so"
    if restarts < workers * waves:
        why += f", capped at {max_restarts} restarts"
    return restarts, workers, why


def probe_seconds(budget: float) -> float:
    low, high = PROBE_SECONDS
    return min(high, max(low, PROBE_SHARE * budget))


def probe(view, method: str, kwargs: dict[str, Any], *, deadline: Deadline, threads: int, seed: int, device: str) -> float | None:
    """Iterations per second of one run of ``method`` alone at ``threads`` threads until ``deadline`` (None if it
    diverged or ran none)."""
    import torch

    from exhume.attacks import get_attack

    atk = get_attack(method, **kwargs)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        recon = atk.run(view, out=None, seed=seed, device=device, progress=False, deadline=deadline)
    except DivergenceError:
        return None
    finally:
        torch.set_num_threads(before)
    its, secs = recon.record.iterations, recon.record.seconds
    if not its or not secs:
        return None
    return float(its) / float(secs)


def size(view, method: str, kwargs: dict[str, Any], deadline: Deadline, workers: int, *, fixed_workers: bool,
         seed: int, device: str) -> Sizing:
    """Probe the attack and choose the restarts and workers for ``deadline``'s seconds (see the module's docstring)."""
    import torch

    from exhume.portfolio.runner import start_method, threads_per_worker

    budget = float(deadline.seconds)  # the budget as given: the restarts' waves end with the deadline itself
    threads = threads_per_worker(workers, start_method(device)) if workers > 1 else torch.get_num_threads()
    t0 = time.perf_counter()
    rate = probe(view, method, kwargs, deadline=deadline.sooner(probe_seconds(budget)), threads=threads, seed=seed, device=device)
    spent = time.perf_counter() - t0
    left = max(budget - spent, 0.5 * budget)
    plan = restart_plan(method)
    if rate is None:
        from exhume.portfolio.variants import default_restarts

        n = default_restarts(left, workers, plan.seconds_per_restart)
        return Sizing(n, workers, round(left, 3), None, threads, round(spent, 3), None,
                      "the probe run diverged or ran no iteration: restarts by time alone")
    n, w, why = choose(left, rate, workers, fixed_workers=fixed_workers, min_iterations=plan.min_iterations or MIN_ITERATIONS_PER_RESTART,
                       seconds_per_restart=plan.seconds_per_restart or SECONDS_PER_RESTART, max_restarts=MAX_AUTO_RESTARTS,
                       efficiency=PARALLEL_EFFICIENCY)
    waves = math.ceil(n / w)
    eff = PARALLEL_EFFICIENCY if w > 1 else 1.0
    expected = round(left / waves * rate * eff) if w == workers else None  # the fallback's all-core rate was not probed
    return Sizing(n, w, round(left, 3), round(rate, 3), threads, round(spent, 3), expected, why)


def load(out: str | Path | None) -> Sizing | None:
    """The sizing stored by an earlier run of this portfolio folder, if any."""
    from exhume.files.jsonio import read_json

    if out is None or not (Path(out) / "restarts" / SIZING_FILE).is_file():
        return None
    rec = read_json(Path(out) / "restarts" / SIZING_FILE, ExhumeError, "the restart sizing written by a portfolio")
    try:
        return Sizing.from_record(rec)
    except (KeyError, TypeError, ValueError) as e:
        raise ExhumeError(f"{Path(out) / 'restarts' / SIZING_FILE}: not a restart sizing ({e}); delete it to probe again") from None


def save(out: str | Path | None, sizing: Sizing) -> None:
    from exhume.files.jsonio import write_json

    if out is None:
        return
    folder = Path(out) / "restarts"
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / SIZING_FILE, sizing.record())
