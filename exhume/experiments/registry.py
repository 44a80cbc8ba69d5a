"""Named experiments (``exhume experiment NAME``) that reproduce the papers' findings.

Each experiment registers a name, a help text that states its CPU default (cases, epochs,
iterations; the times measured are in docs/defaults.md, not in the help), an argument hook and
a run function. It writes its figure(s) and table(s) into its run folder and returns a dict of
headline numbers, including what the paper found and what this run found, side by side.
The pieces they share are here too: their flags' parsing, the command that reproduces a run, CSV tables.
"""

from __future__ import annotations

import argparse
import csv
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
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


def positive_numbers(text: str, kind: type, what: str) -> list:
    """``--WHAT``'s comma-separated numbers (``kind``: int or float), each > 0; one line naming the flag otherwise."""
    try:
        values = [kind(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--{what} must be numbers separated by commas, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise ConfigError(f"--{what} must be positive numbers separated by commas, got {text!r}")
    return values


def seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated integers >= 0; one line otherwise."""
    try:
        seeds = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise ConfigError(f"--seeds must be integers >= 0 separated by commas, got {text!r}")
    return seeds


def command_line(name: str, args: argparse.Namespace, keys: Sequence[str], flags: Sequence[str] = ()) -> str:
    """The command that reproduces a run of experiment ``name``: ``--full``, the flags among ``keys`` that were given,
    ``flags``, and the seed (its settings; not its output folder)."""
    given = ["--full"] if args.full else []
    for key in keys:
        if getattr(args, key, None) is not None:
            given.append(f"{'-n' if key == 'n' else '--' + key.replace('_', '-')} {getattr(args, key)}")
    given += flags
    if getattr(args, "seeds", None) is None and not args.full and args.seed != 0:
        given.append(f"--seed {args.seed}")
    return " ".join([f"exhume experiment {name}", *given])


def write_csv(path: Path, rows: list[dict[str, Any]], keys: Sequence[str] | None = None) -> None:
    """``rows`` as a CSV table, one column per key (default: every row's keys, in the order they first appear)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(keys or dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


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
