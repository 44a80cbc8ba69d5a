"""Named experiments (``exhume experiment NAME``) that reproduce the papers' findings.

Each experiment registers a name, a help text that states its CPU default (cases, epochs,
iterations; the times measured are in docs/defaults.md, not in the help), an argument hook and
a run function. It writes its figure(s) and table(s) into its run folder and returns a dict of
headline numbers, including what the paper found and what this run found, side by side.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from exhume.errors import ConfigError


@dataclass(frozen=True)
class Experiment:
    name: str
    help: str
    run: Callable[[argparse.Namespace], dict[str, Any]]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


EXPERIMENTS: dict[str, Experiment] = {}


def register_experiment(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None):
    """Decorator: ``@register_experiment("margin", "…", add_args)`` on ``run(args) -> dict``."""

    def wrap(fn: Callable[[argparse.Namespace], dict[str, Any]]):
        EXPERIMENTS[name] = Experiment(name=name, help=help, run=fn, add_arguments=add_arguments)
        return fn

    return wrap


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS)) or 'none'}")
    return EXPERIMENTS[name]


class ChunkEnd(KeyboardInterrupt):
    """A chunk's time is up (``--chunk-seconds``): raised where the run is, so that training and
    attacks write their checkpoints as on Ctrl-C; ``--resume`` continues."""


@contextmanager
def chunk_deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ChunkEnd` in the main thread after ``seconds`` of wall time (None: never)."""
    if seconds is None:
        yield
        return
    if not seconds > 0:
        raise ConfigError(f"--chunk-seconds must be a positive number of seconds, got {seconds!r}")
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise ConfigError("--chunk-seconds needs POSIX timers in the main thread; stop the run yourself and use --resume")

    def fire(signum, frame):
        raise ChunkEnd()

    def ignored(unraisable) -> None:  # raised inside a finaliser or a weakref callback, Python drops it: raise it again
        if isinstance(unraisable.exc_value, ChunkEnd):
            signal.setitimer(signal.ITIMER_REAL, 0.001)
        else:
            hook(unraisable)

    previous, hook = signal.signal(signal.SIGALRM, fire), sys.unraisablehook
    sys.unraisablehook = ignored
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = hook
