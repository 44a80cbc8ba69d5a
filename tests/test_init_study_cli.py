"""The initialisation study and --init through the CLI, end to end on tiny settings, and its errors."""

from __future__ import annotations

import json

import pytest

from exhume.cli import main


def test_init_study_end_to_end_on_a_tiny_grid(tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["experiment", "init-study", "-o", str(out), "--grid", "0,1", "-n", "6", "--kkt-arch", "mlp:16;bias=all",
            "--bilevel-arch", "affine",  # the ReLU default's converged lower level is tested in test_bilevel.py
            "--kkt-iterations", "20", "--bilevel-iterations", "3", "--heldout", "20", "--victim-seconds", "1", "--no-progress"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    rows = json.loads((out / "table.json").read_text())["rows"]
    assert len(rows) == 8 and {r["attack"] for r in rows} == {"kkt", "bilevel"}
    for r in rows:
        assert r["oracle_init"] is True and 0.0 <= r["membership_auc"] <= 1.0
        assert (r["param_distance"] is None) == (r["attack"] == "kkt")
    gt = next(r for r in rows if r["attack"] == "bilevel" and r["l1"] == 1 and r["l2"] == 1)
    assert gt["init_d_train"] == 0.0 and gt["init_nearest_set"] == "train"
    noise = [r for r in rows if r["attack"] == "kkt" and r["l2"] == 0]
    assert len(noise) == 2 and noise[0]["d_train"] == noise[1]["d_train"]  # λ₂ = 0 shares one pure-noise run
    assert {v["corner"].split(" ")[0] for v in result["verdict"]} == {"noise", "ground", "partition"}
    for name in ("table.csv", "verdict.md", "heatmaps_kkt.png", "lines_bilevel.png", "corners.png"):
        assert (out / name).stat().st_size > 200
    assert "ORACLE" in (out / "verdict.md").read_text()  # --resume: tests/test_chunks.py (a run cut into chunks)


def test_attack_with_partition_init_is_labelled_oracle_and_evaluated_with_membership_auc(tmp_path, capsys):
    v, a = tmp_path / "victim", tmp_path / "attack"
    assert main(["train", "-o", str(v), "-n", "6", "--arch", "affine", "--lr", "0.5", "--epochs", "200", "--no-progress"]) == 0
    assert main(["attack", str(v), "-o", str(a), "--method", "bilevel", "--iterations", "3", "--init", "mix",
                 "--mix-l1", "0.5", "--mix-l2", "0.75", "--no-progress"]) == 0
    assert "ORACLE" in capsys.readouterr().out
    recon = json.loads((a / "reconstruction.json").read_text())
    assert recon["config"]["init"] == "mix(l1=0.5,l2=0.75)" and recon["config"]["oracle_init"] is True
    assert main(["evaluate", str(a), "--against", str(v), "--pool-size", "30"]) == 0
    out = capsys.readouterr().out
    assert "membership AUC" in out and "ORACLE" in out
    metrics = json.loads((a / "evaluation" / "metrics.json").read_text())
    assert 0.0 <= metrics["membership_auc"] <= 1.0 and metrics["membership"]["n_heldout"] == 30


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--grid", "0,2"], "--grid values must lie in [0, 1]"),
        (["--grid", "a,b"], "--grid must be numbers"),
        (["--attacks", "magic"], "--attacks must list"),
        (["-n", "5"], "-n must be an even number"),
        (["--kkt-iterations", "0"], "--kkt-iterations must be >= 1"),
        (["--bilevel-damping", "-1"], "--bilevel-damping must be >= 0"),
    ],
)
def test_init_study_refuses_bad_arguments(extra, message, tmp_path, capsys):
    assert main(["experiment", "init-study", "-o", str(tmp_path / "s"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_attack_refuses_mix_weights_without_mix(tmp_path, capsys):
    v = tmp_path / "victim"
    assert main(["train", "-o", str(v), "-n", "4", "--arch", "affine", "--epochs", "5", "--no-progress"]) == 0
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "--init", "partition", "--mix-l1", "0.5"]) == 2
    assert "--mix-l1/--mix-l2 apply only with --init mix" in capsys.readouterr().err
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "--init", "mix", "--mix-l1", "0.5"]) == 2
    assert "needs both weights" in capsys.readouterr().err
