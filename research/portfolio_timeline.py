"""Where a portfolio's wall time goes: each phase and each worker process timed, spawned workers.

    OMP_NUM_THREADS=1 python research/portfolio_timeline.py VICTIM SECONDS WORKERS [OUT]

Runs ``exhume.attack(victim, "kkt", max_seconds=SECONDS, workers=WORKERS)`` with spawned workers (the path
of GPUs and macOS, forced here), and prints the portfolio's wall time, each restart's seconds and
iterations, and one line per process: wall-clock events (imported, worker initialised, restart begun and
ended, the attack's set-up, loop and result, the probe, the pooling) relative to the process's start.
"""

from __future__ import annotations

import time

EVENTS = [("top", time.time())]

import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import exhume  # noqa: E402
from exhume.portfolio import runner  # noqa: E402

EVENTS.append(("imported", time.time()))
LOG = os.environ.get("EXHUME_TIMELINE", os.path.join(tempfile.gettempdir(), "exhume-timeline"))


def mark(what: str) -> None:
    EVENTS.append((what, time.time()))
    with open(os.path.join(LOG, f"{os.getpid()}.json"), "w") as f:
        json.dump(EVENTS, f)


def wrap(obj, name: str, tag: str) -> None:
    f = getattr(obj, name)

    @functools.wraps(f)
    def timed(*a, **k):
        mark(f"{tag}>")
        try:
            return f(*a, **k)
        finally:
            mark(f"<{tag}")

    setattr(obj, name, timed)


def instrument() -> None:
    from exhume.attacks import kkt

    wrap(kkt.KKTAttack, "problem", "setup")
    wrap(kkt, "attack_loop", "loop")
    wrap(kkt.KKTAttack, "result", "result")


_init = runner._init_worker
_run = runner._run_local


def init_worker(*args):
    mark("init>")
    _init(*args)
    instrument()
    mark("<init")


def run_local(*a, **k):
    mark("restart>")
    try:
        return _run(*a, **k)
    finally:
        mark("<restart")


def main() -> None:
    shutil.rmtree(LOG, ignore_errors=True)
    os.makedirs(LOG)
    victim, seconds, workers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    runner.start_method = lambda device: "spawn"
    runner._init_worker, runner._run_local = init_worker, run_local
    from exhume.portfolio import run as run_mod
    from exhume.portfolio import sizing

    wrap(sizing, "size", "probe")
    wrap(run_mod, "run_local", "restarts")
    wrap(run_mod, "pool", "pool")
    instrument()
    v = exhume.load_victim(victim)
    t0 = time.time()
    mark("attack>")
    r = exhume.attack(v, "kkt", max_seconds=seconds, workers=workers, progress=False, out=sys.argv[4] if len(sys.argv) > 4 else None)
    mark("<attack")
    print("wall", round(time.time() - t0, 2), r.summary["seconds_per_restart"], r.summary["iterations_per_restart"])
    for name in sorted(os.listdir(LOG)):
        with open(os.path.join(LOG, name)) as f:
            events = json.load(f)
        print(name, " ".join(f"{k}:{t - events[0][1]:+.1f}" for k, t in events))


if __name__ == "__main__":
    main()
