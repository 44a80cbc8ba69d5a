"""The one deadline (exhume/deadline.py): an instant on the wall clock, shared by pickling, each layer taking a share
or a sub-deadline of the one it was given; made at the entry point, never read from a global."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from exhume.deadline import NEVER, Deadline
from exhume.errors import ConfigError

EXHUME = Path(__file__).resolve().parents[1] / "exhume"


def test_a_deadline_is_an_instant_with_the_seconds_it_was_made_with():
    now = time.time()
    d = Deadline.after(10.0)
    assert d.seconds == 10.0 and now + 10.0 <= d.at <= time.time() + 10.0 and 9.0 < d.left() <= 10.0 and not d.passed()
    since = Deadline.after(10.0, since=now - 4.0)  # a command's, counted from its process's start
    assert 5.0 < since.left() <= 6.0 and 4.0 <= since.spent() < 5.0
    past = Deadline.after(1.0, since=now - 2.0)
    assert past.passed() and past.left() == 0.0
    assert Deadline.never() == NEVER == Deadline.after(None) and NEVER.left() is None and not NEVER.passed()
    assert pickle.loads(pickle.dumps(d)) == d  # spawned workers receive it as it is


def test_each_layer_takes_a_share_or_a_sub_deadline():
    d = Deadline.after(100.0)
    assert d.sooner(10.0).seconds == 10.0 and 9.0 < d.sooner(10.0).left() <= 10.0
    assert d.sooner(1000.0).at == d.at and d.sooner(1000.0).seconds == 100.0 and d.sooner(None) is d
    assert 49.0 < d.share(0.5).left() <= 50.0 and d.share(1.0).at == pytest.approx(d.at, abs=0.05)
    kept = d.reserve(20.0)
    assert kept.at == d.at - 20.0 and kept.seconds == 80.0
    floor = Deadline.after(1.0).at_least(30.0)
    assert 29.0 < floor.left() <= 30.0 and d.at_least(30.0) is d
    for derived in (NEVER.sooner(5.0), Deadline.after(5.0)):
        assert derived.seconds == 5.0
    assert NEVER.share(0.5) is NEVER and NEVER.reserve(3.0) is NEVER and NEVER.at_least(3.0) is NEVER
    assert d.later(5.0).at == d.at + 5.0 and d.later(5.0).seconds == 105.0 and NEVER.later(5.0) is NEVER


@pytest.mark.parametrize("make, message", [
    (lambda: Deadline.after(-1.0), "a deadline's seconds must be a finite number of seconds >= 0, got -1.0"),
    (lambda: Deadline.after(float("inf")), "got inf"),
    (lambda: Deadline.after("60"), "got '60'"),
    (lambda: Deadline.after(5.0).share(1.5), "a deadline's share must be in \\[0, 1\\], got 1.5"),
    (lambda: Deadline.after(5.0).reserve(float("nan")), "a deadline's reserve must be"),
])
def test_a_bad_number_of_seconds_is_one_line(make, message):
    with pytest.raises(ConfigError, match=message) as e:
        make()
    assert "\n" not in str(e.value)


def test_no_hidden_global_remains():
    """The deadline (and a run's owner) travel as arguments: no ContextVar, no wall_deadline block."""
    for path in EXHUME.rglob("*.py"):
        text = path.read_text()
        assert "ContextVar" not in text and "wall_deadline" not in text and "past_deadline" not in text, path
