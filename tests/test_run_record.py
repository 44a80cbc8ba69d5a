"""The typed run record (:class:`exhume.attacks.RunRecord`): what the rooms above the attacks read of a run.

Each attack makes its record and the portfolio builds the pooled one; runs saved before the record existed still
load, and are written back as they were (a pooled run folder written by the previous release is kept in
tests/data/run_before_record, a single kkt run's reconstruction.json beside it); a record that is not one is one
clear error; and the record changed no result: a kkt run and a 2-restart portfolio at fixed seeds and iterations
give the candidates they gave before, bit for bit, saved under the same keys and read back as the same record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import exhume
from exhume.attacks import Reconstruction, RunRecord, SolvedEquation, attack_class, load_reconstruction
from exhume.attacks.engine.record import parse_record
from exhume.equations.kinds import KnownStart
from exhume.errors import ExhumeError
from exhume.evaluation.assumptions import attack_failures, equation_of
from exhume.evaluation.identifiability import attack_best

DATA = Path(__file__).parent / "data"
OLD_POOLED = DATA / "run_before_record"
OLD_SINGLE = DATA / "reconstruction_kkt_before_record.json"


def test_a_pooled_run_folder_written_before_the_record_loads_and_reads_as_attributes():
    recon = load_reconstruction(OLD_POOLED)
    rec = recon.record
    assert rec.equation is SolvedEquation.STATIONARY and rec.equation.stationary and rec.threat_model == "weights only"
    assert (rec.iterations, rec.seconds, rec.init, rec.oracle_init, rec.n_guess) == (60, 0.504, "noise", False, 10)
    assert rec.final_relative_stationarity is None and [r.iterations for r in rec.portfolio.restarts] == [30, 30]
    assert rec.best_residual == (0.3744363784790039, 2) == attack_best(recon)
    port = rec.portfolio
    assert [(r.restart, r.seed, r.status, r.iterations) for r in port.restarts] == [(0, 3, "complete", 30), (1, 4, "complete", 30)]
    assert dict(port.restarts[1].overrides) == {"lr_lambda": 0.01} and port.restarts[0].host == "vm"
    assert port.batched == {"used": False, "why": "auto: on CPU, one forked worker per core"} and port.sizing is None
    assert (port.restarts_complete, port.candidates_before_merge, port.candidates) == (2, 40, recon.candidates.shape[0])
    assert (port.restart_seconds_total, port.starved_restarts, port.starved_rule) == (
        0.4, (), "fewer than 0.5 x the median iterations of the restarts")
    assert rec.settings["lr"] == 0.01 and rec.n_guess == 10 and "portfolio" not in rec.settings and "init" not in rec.settings
    assert rec.extras == {} and port.pooling["varied_settings"] == ["lr_lambda", "lr_lambda_used"]
    saved = json.loads((OLD_POOLED / "reconstruction.json").read_text())
    assert recon.config == saved["config"] and recon.summary == saved["summary"]  # read once, written back as the file holds it
    assert attack_failures(recon) == [] and equation_of("kkt", recon=recon) == attack_class("kkt").equation


def _saved(tmp_path: Path, meta: dict, m: int = 3) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    Reconstruction("kkt", torch.rand(m, 1, 28, 28), torch.ones(m), torch.rand(m), RunRecord(), 0).save(folder)
    (folder / "reconstruction.json").write_text(json.dumps(meta))
    return folder


def test_a_single_kkt_run_written_before_the_record_loads(tmp_path):
    meta = json.loads(OLD_SINGLE.read_text())
    rec = load_reconstruction(_saved(tmp_path, meta)).record
    assert (rec.iterations, rec.kept_iteration, rec.portfolio) == (30, 30, None)
    assert rec.final_relative_stationarity == pytest.approx(0.3744363784790039, abs=0) and rec.best_residual[1] == 1
    assert rec.extras["kept_iterate"].startswith("exponential moving average") and rec.settings["iterations"] == 30


def test_an_old_run_with_almost_nothing_recorded_still_loads(tmp_path):
    """Before the equation, the threat model or the fingerprint were recorded: the stationarity equation, the rest None."""
    rec = load_reconstruction(_saved(tmp_path, {"method": "kkt", "config": {"lr": 0.1}, "seed": 0})).record
    assert rec.equation is SolvedEquation.STATIONARY and rec.threat_model is None and rec.iterations is None
    assert rec.portfolio is None and not rec.oracle_init and rec.best_residual == (None, 0) and dict(rec.settings) == {"lr": 0.1}


def test_a_simulated_training_run_is_judged_by_the_endpoints_equation():
    sim = Reconstruction("simulate", torch.rand(2, 4), torch.ones(2), None,
                         RunRecord(equation=SolvedEquation.SIMULATED, final_relative_stationarity=0.9), 0)
    assert sim.record.equation is SolvedEquation.SIMULATED and sim.record.equation.known_start_kind == "endpoints"
    eq = equation_of("simulate", recon=sim)
    assert isinstance(eq, KnownStart) and eq.kind == "endpoints"
    assert "the known-start equation" in attack_failures(sim)[0]


def test_a_record_writes_what_its_run_stated_and_reads_back_the_same():
    """The attacks' records as reconstruction.json holds them: the settings, then the typed entries a run stated (a
    bilevel run states no threat model nor equation; an inversion run no init), then the extras; read back equal."""
    bilevel = RunRecord(iterations=5, seconds=0.1, init="partition", settings={"lr": 0.1, "n_guess": 10}, extras={"param_distance": 0.5})
    assert list(bilevel.config_json()) == ["lr", "n_guess", "init", "oracle_init"] and bilevel.config_json()["oracle_init"] is True
    assert list(bilevel.summary_json()) == ["iterations", "seconds", "param_distance"] and bilevel.n_guess == 10
    simulated = RunRecord(equation=SolvedEquation.SIMULATED, final_relative_stationarity=0.2, settings={"steps": 4})
    assert simulated.config_json() == {"steps": 4, "equation_used": "simulated training"}
    known = RunRecord(threat_model="the attacker knows the starting weights", equation=SolvedEquation.ENDPOINTS, kept_iteration=3,
                      final_relative_stationarity=0.1, final_relative_stationarity_note="of what training added", extras={"kept_criterion": 0.2})
    assert list(known.summary_json()) == ["final_relative_stationarity", "final_relative_stationarity_note", "threat_model",
                                          "kept_iteration", "kept_criterion"]
    for record in (bilevel, simulated, known, RunRecord()):
        saved = json.loads(json.dumps({"config": record.config_json(), "summary": record.summary_json()}))
        assert parse_record(saved["config"], saved["summary"]) == record


@pytest.mark.parametrize("config, summary, message", [
    ({}, {"iterations": "many"}, "summary.iterations must be an integer or null, got 'many'"),
    ({}, {"seconds": True}, "summary.seconds must be a number or null, got True"),
    ({"equation_used": "maxwell"}, {}, "config.equation_used 'maxwell' is no equation an attack solves; known: 'stationary'"),
    ({"portfolio": {"restarts": [{"restart": 0}]}}, {}, "config.portfolio.restarts[0] must be an object with an integer 'restart' and a string 'status'"),
    ({"portfolio": [1, 2]}, {}, "config.portfolio must be an object with a list of restarts"),
    ({"portfolio": {"restarts": [{"restart": 0, "status": "complete", "iterations": 2.5}]}}, {},
     "config.portfolio.restarts[0].iterations must be an integer or null, got 2.5"),
    ([1], {}, "its config must be an object, got list"),
])
def test_a_record_that_is_not_one_is_one_clear_error(tmp_path, config, summary, message):
    with pytest.raises(ExhumeError) as err:
        parse_record(config, summary)
    assert message in str(err.value) and "\n" not in str(err.value)
    folder = _saved(tmp_path, {"method": "kkt", "config": config, "seed": 0, "summary": summary})
    with pytest.raises(ExhumeError, match=str(folder)):
        load_reconstruction(folder)


def test_reading_the_record_changed_no_result_and_no_key(victim_dir, tmp_path, one_thread):
    """A lone run and a 2-restart portfolio whose restart 0 has the lone run's seed and settings, in the same process:
    that restart's candidates, multipliers and labels are the lone run's, bit for bit; the record keeps every key an
    older run wrote and reads back as made. (Bit identity across revisions: benchmarks/bit_identity.py.)"""
    victim = exhume.load_victim(victim_dir)
    one = exhume.attack(victim, "kkt", seed=3, restarts=1, progress=False, iterations=30, out=tmp_path / "one")
    two = exhume.attack(victim, "kkt", seed=3, restarts=2, workers=1, progress=False, iterations=30, out=tmp_path / "two")
    zero = load_reconstruction(tmp_path / "two" / "restarts" / "0")
    assert zero.seed == 3 and zero.record.iterations == one.record.iterations == 30
    assert all(torch.equal(a, b) for a, b in ((zero.candidates, one.candidates), (zero.scores, one.scores), (zero.labels, one.labels)))
    for got, before in ((tmp_path / "one" / "reconstruction.json", OLD_SINGLE), (tmp_path / "two" / "reconstruction.json",
                                                                                 OLD_POOLED / "reconstruction.json")):
        new, old = json.loads(got.read_text()), json.loads(before.read_text())
        # every key an older run wrote is still written (a new setting may add its own), but settings kkt no longer has,
        # the sphere's radius they recorded, and the run's plumbing and the victim's facts (now its run's and its view's)
        from exhume.attacks.engine.base import MOVED

        gone = {*attack_class("kkt").retired, *MOVED, "sphere_radius"}
        assert set(new) == set(old) and set(new["config"]) >= set(old["config"]) - gone and set(new["summary"]) >= set(old["summary"])
    assert set(json.loads((tmp_path / "two" / "reconstruction.json").read_text())["config"]["portfolio"]) >= set(
        json.loads((OLD_POOLED / "reconstruction.json").read_text())["config"]["portfolio"])
    for run, made in (("one", one), ("two", two)):  # the record the attack made, saved and read back
        again = load_reconstruction(tmp_path / run)
        assert torch.equal(again.candidates, made.candidates) and again.record == made.record



def test_exhume_evaluate_refuses_a_bad_record_in_one_line(victim_dir, tmp_path, capsys):
    from exhume.cli import main

    meta = json.loads((OLD_POOLED / "reconstruction.json").read_text())
    meta["config"]["equation_used"] = "maxwell"
    folder = _saved(tmp_path, meta)
    assert main(["evaluate", str(folder), "--against", str(victim_dir), "-o", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.equation_used 'maxwell' is no equation an attack solves" in err[0]
    assert not (tmp_path / "eval" / "metrics.json").exists()
