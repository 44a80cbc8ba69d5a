"""No silent overwrite: every command that writes a folder refuses one holding an earlier output of it
(exit 2, one line naming --force) and replaces it with --force. The audit's refusal and --force are
tested in test_audit.py (test_audit_cli_on_a_users_own_model_writes_a_verdict_and_a_report), the
attack's lock and --resume in test_runfolder.py."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from exhume.cli import main

TRAIN = ["train", "--data", "mnist", "-n", "10", "--arch", "mlp:16;bias=none;init=1e-3", "--epochs", "20", "--no-progress"]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _refused(capsys, folder) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(folder) in err and "--force" in err and "Traceback" not in err, err
    return err


def test_train_refuses_a_folder_holding_a_victim_and_replaces_it_with_force(tmp_path, capsys):
    out = tmp_path / "victim"
    assert main([*TRAIN, "-o", str(out)]) == 0
    first = _digest(out)
    assert main([*TRAIN, "--seed", "1", "-o", str(out)]) == 2
    err = _refused(capsys, out)
    assert "already holds a victim" in err and "--resume" not in err  # train cannot resume
    assert _digest(out) == first  # weights and indices untouched
    assert main([*TRAIN, "--seed", "1", "-o", str(out), "--force"]) == 0
    second = _digest(out)
    assert second["model.safetensors"] != first["model.safetensors"] and second["train_indices.npy"] != first["train_indices.npy"]
    # an attack run's folder is not a place for a victim either
    run = tmp_path / "run"
    assert main(["attack", str(out), "-o", str(run), "--restarts", "1", "--iterations", "3", "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*TRAIN, "-o", str(run)]) == 2
    assert "already holds a victim or a run" in _refused(capsys, run) and not (run / "victim.json").exists()


@pytest.fixture(scope="module")
def run(make_tiny_victim, tmp_path_factory):
    """An attack run (3 iterations) of a tiny victim, and the victim."""
    victim = make_tiny_victim(arch="mlp:16;bias=none;init=1e-3", epochs=30, test_size=20)
    folder = tmp_path_factory.mktemp("overwrite") / "run"
    assert main(["attack", str(victim), "-o", str(folder), "--restarts", "1", "--iterations", "3", "--no-progress"]) == 0
    return folder, victim


def test_attack_refuses_an_earlier_run_and_replaces_it_with_force(run, tmp_path, capsys):
    folder, victim = tmp_path / "run", run[1]
    argv = ["attack", str(victim), "-o", str(folder), "--restarts", "1", "--no-progress"]
    assert main([*argv, "--iterations", "3"]) == 0
    capsys.readouterr()
    assert main([*argv, "--iterations", "4"]) == 2
    assert "--resume" in _refused(capsys, folder)
    assert main([*argv, "--iterations", "4", "--force"]) == 0
    assert '"iterations": 4' in capsys.readouterr().out


def test_evaluate_and_report_refuse_their_earlier_output_and_replace_it_with_force(run, tmp_path, capsys):
    folder, victim = run
    shutil.copytree(folder, tmp_path / "run")
    folder = tmp_path / "run"
    evaluate = ["evaluate", str(folder), "--against", str(victim), "--pool-size", "20"]
    assert main(evaluate) == 0
    metrics = folder / "evaluation" / "metrics.json"
    before = metrics.read_bytes()
    capsys.readouterr()
    assert main([*evaluate[:-1], "30"]) == 2  # another pool size: the earlier evaluation is not replaced silently
    assert "already holds an evaluation" in _refused(capsys, folder / "evaluation") and metrics.read_bytes() == before
    assert main([*evaluate[:-1], "30", "--force"]) == 0
    assert b'"pool_size": 30' in metrics.read_bytes()
    assert main(["report", str(folder)]) == 0
    report = folder / "report.html"
    report.write_text("kept")
    capsys.readouterr()
    assert main(["report", str(folder)]) == 2
    assert "already exists" in _refused(capsys, report) and report.read_text() == "kept"
    assert main(["report", str(folder), "--force"]) == 0
    assert report.read_text().startswith("<!DOCTYPE html>")


def test_demo_refuses_an_earlier_demo_and_replaces_it_with_force(tmp_path, capsys, monkeypatch):
    import exhume.demo

    out = tmp_path / "demo"
    (out / "victim").mkdir(parents=True)
    (out / "victim" / "victim.json").write_text("{}")
    argv = ["demo", "-o", str(out), "--no-progress", "--train-seconds", "1", "--attack-seconds", "1"]
    assert main(argv) == 2
    err = _refused(capsys, out)
    assert "already holds a demo" in err and "--resume" in err and (out / "victim" / "victim.json").exists()
    seen = []
    monkeypatch.setattr(exhume.demo, "_demo", lambda out, *a: seen.append(sorted(p.name for p in out.iterdir())) or {})
    assert main([*argv, "--force"]) == 0 and seen == [[".exhume.lock"]]  # the earlier victim removed before training
    (out / "victim").mkdir()
    assert main([*argv, "--resume"]) == 0 and seen[-1] == [".exhume.lock", "victim"]  # --resume continues it


def test_tune_refuses_a_folder_holding_a_victim_or_a_run(run, capsys):
    folder, victim = run
    for out in (victim, folder):
        before = sorted(p.name for p in out.iterdir())
        assert main(["tune", str(victim), "--trials", "1", "--trial-seconds", "1", "-o", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(out) in err and "folder of its own" in err
        assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("name", ["margin", "architecture", "weight-decay", "multiclass", "width-vs-n", "cnn", "init-study",
                                  "tldr", "law", "dp"])
def test_experiments_refuse_an_earlier_run_without_resume_or_force(name, tmp_path, capsys, monkeypatch):
    import dataclasses

    from exhume.experiments import EXPERIMENTS

    out = tmp_path / "exp"
    out.mkdir()
    (out / "results.json").write_text("{}")
    ran = []
    monkeypatch.setitem(EXPERIMENTS, name, dataclasses.replace(EXPERIMENTS[name], run=lambda args: ran.append((args.resume, args.force)) or {}))
    assert main(["experiment", name, "-o", str(out), "--no-progress"]) == 2
    err = _refused(capsys, out)
    assert "--resume" in err and ran == [] and (out / "results.json").read_text() == "{}"
    for flag in ("--resume", "--force"):
        assert main(["experiment", name, "-o", str(out), "--no-progress", flag]) == 0
    assert ran == [(True, False), (False, True)]
    assert main(["experiment", name, "-o", str(tmp_path / "new"), "--no-progress"]) == 0  # a new folder needs neither
