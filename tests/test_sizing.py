"""How many restarts a time budget buys: the rule on numbers, the probe on a real tiny victim, the
fallback to one run for a slow victim, and a resume that reuses the stored decision."""

from __future__ import annotations

import pytest
import torch

import exhume
import exhume.portfolio.run as prun
from exhume.portfolio import run_portfolio, sizing
from exhume.portfolio.report import summary_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # one torch thread; victim_dir: the tiny victim of conftest.py


@pytest.mark.parametrize("budget, rate, workers, fixed, expect", [
    (360, 60.0, 2, False, (16, 2)),    # the demo victim: 8 waves of 45 s, ~2,300 iterations each
    (90, 12.0, 2, False, (1, 1)),      # a 1000-1000 victim: two parallel restarts would get ~900 each -> one run
    (90, 12.0, 2, True, (2, 2)),       # ... unless the caller fixed the workers: one wave, flagged as short
    (90, 50.0, 1, False, (2, 1)),      # 4,500 iterations: two restarts of 2,250
    (90, 30.0, 1, False, (1, 1)),      # 2,700 iterations: one restart
    (90, 40.0, 1, False, (2, 1)),      # 3,600 iterations: two of 1,800 (the nearest number of restarts of 2,000)
    (90, 33.4, 1, False, (2, 1)),      # 3,006 iterations: two of 1,503, at least 3/4 of the 2,000 asked for
    (1800, 100.0, 2, False, (64, 2)),  # 80 by time, capped at MAX_AUTO_RESTARTS
])
def test_choose(budget, rate, workers, fixed, expect):
    n, w, why = sizing.choose(budget, rate, workers, fixed_workers=fixed, min_iterations=2000, seconds_per_restart=45.0,
                              max_restarts=64, efficiency=0.85)
    assert (n, w) == expect, why
    if expect == (2, 2):
        assert why.startswith("one wave of 2: below 2000")
    waves = -(-n // w)
    per = budget / waves * rate * (0.85 if w > 1 else 1.0)
    assert per >= 0.75 * 2000 or waves == 1, "a restart gets 3/4 of the floor or more unless the budget is one wave"


def test_auto_portfolio_probes_and_splits_what_is_left(victim_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(sizing, "SECONDS_PER_RESTART", 1.0)  # the tiny victim runs thousands of iterations per second
    monkeypatch.setattr(sizing, "PROBE_SECONDS", (0.3, 0.3))
    # the restarts are bounded by time, not by iterations, at any rate above ~10 it/s (2.7 s x rate / 10 >= 2.5): the
    # probe measured 39 and 57 it/s on a 2-core machine under a load of 14-16 (the second under coverage), thousands idle
    monkeypatch.setattr(sizing, "MIN_ITERATIONS_PER_RESTART", 10)
    victim = exhume.load_victim(victim_dir)
    r = run_portfolio(victim, max_seconds=3.0, workers=1, out=tmp_path / "run", progress=False, iterations=10_000_000)
    s = r.config["portfolio"]["sizing"]
    assert s["rate"] > 10 and s["threads"] == 1 and s["workers"] == 1  # measured 31-490 it/s; 7.5 keeps restarts by time
    assert 0.3 <= s["probe_seconds"] < 3.0 and s["seconds"] == pytest.approx(3.0 - s["probe_seconds"], abs=1e-3)
    assert s["restarts"] == r.summary["restarts"] == round(s["seconds"] / 1.0), "restarts of about 1 s fill what the probe left"
    assert r.config["portfolio"]["max_seconds"] == s["seconds"]
    assert all(sec <= s["seconds"] / s["restarts"] + 0.5 for sec in r.summary["seconds_per_restart"])
    assert any(line.startswith(f"restarts sized by a {s['probe_seconds']:.1f}-s probe run (") for line in summary_lines(r.summary, r.config["portfolio"]))

    def no_probe(*a, **k):
        raise AssertionError("a resumed portfolio reuses its stored sizing")

    monkeypatch.setattr(sizing, "probe", no_probe)
    again = run_portfolio(victim, max_seconds=3.0, workers=1, out=tmp_path / "run", resume=True, progress=False, iterations=10_000_000)
    assert again.config["portfolio"]["sizing"] == s
    assert all(row.get("reused") for row in again.config["portfolio"]["restarts"])
    assert torch.equal(again.candidates, r.candidates)


def test_slow_victim_gets_one_run_on_all_cores(victim_dir, monkeypatch, capsys):
    monkeypatch.setattr(sizing, "probe", lambda *a, **k: 5.0)  # a victim far slower than the floor allows
    monkeypatch.setattr(prun, "default_workers", lambda: 2)
    victim = exhume.load_victim(victim_dir)
    r = run_portfolio(victim, max_seconds=2.0, progress=False, iterations=50)
    s = r.config["portfolio"]["sizing"]
    assert (s["restarts"], s["workers"]) == (1, 1) and r.summary["restarts"] == 1
    assert s["reason"].startswith("one run on all cores: 2 parallel restarts would get ~")
    assert s["expected_iterations"] is None, "the all-core rate was not measured"
    fixed = run_portfolio(victim, max_seconds=2.0, workers=2, progress=False, iterations=50)
    assert fixed.config["portfolio"]["sizing"]["workers"] == 2 and fixed.summary["restarts"] == 2


def test_explicit_restarts_or_an_iteration_budget_skip_the_probe(victim_dir, monkeypatch):
    monkeypatch.setattr(sizing, "probe", lambda *a, **k: pytest.fail("no probe without restarts='auto' and a time budget"))
    victim = exhume.load_victim(victim_dir)
    assert "sizing" not in run_portfolio(victim, restarts=2, workers=1, max_seconds=1.0, progress=False).config["portfolio"]
    assert "sizing" not in run_portfolio(victim, workers=1, progress=False, iterations=20).config["portfolio"]


def test_a_diverging_probe_falls_back_to_time_alone(victim_dir, monkeypatch):
    monkeypatch.setattr(sizing, "probe", lambda *a, **k: None)
    victim = exhume.load_victim(victim_dir)
    r = run_portfolio(victim, max_seconds=1.0, workers=1, progress=False, iterations=30)
    assert r.config["portfolio"]["sizing"]["rate"] is None and r.summary["restarts"] == 1
