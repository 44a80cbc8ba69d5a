"""``exhume experiment law``: its table, curve and figure, and the law's behaviour on a tiny random-features grid."""

from __future__ import annotations

import csv
import json

import pytest

from exhume.cli import main

COLUMNS = ("family", "n", "ratio", "seed", "width", "p", "d", "p_over_dn", "variant", "iterations", "seconds", "residual",
           "memorised", "control", "one_to_one_ssim_mean", "memorised_minmax", "verdict")
TINY = ["--families", "random-features", "--ns", "5", "--ratios", "0.25,16", "--variants", "learned", "--iterations", "300",
        "--no-progress"]


def test_the_law_experiment_recovers_more_training_digits_far_above_the_threshold_than_below_it(tmp_path):
    from exhume.audit.law import load_measured

    out = tmp_path / "law"
    assert main(["experiment", "law", "-o", str(out), *TINY]) == 0
    with open(out / "law.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["family"], float(r["ratio"]), r["variant"]) for r in rows] == [("random-features", 0.25, "learned"),
                                                                             ("random-features", 16.0, "learned")]
    assert set(COLUMNS) <= set(rows[0]) and all(int(r["iterations"]) == 300 and int(r["d"]) == 64 for r in rows)
    assert [float(r["p_over_dn"]) for r in rows] == [0.25, 16.0] and [int(r["width"]) for r in rows] == [80, 5120]
    curve = load_measured(out / "law-curve.json")  # the format the audit reads
    small, large = curve["points"]
    assert curve["command"] == "exhume experiment law " + " ".join(
        f"--{k} {v}" for k, v in (("families", "random-features"), ("ratios", "0.25,16"), ("ns", "5"), ("iterations", "300"),
                                  ("variants", "learned")))
    assert (small["p_over_dn"], large["p_over_dn"]) == (0.25, 16.0) and small["training_samples"] == 5
    # the law: far above p/(d·n) = 1 the training digits are recovered (memorised against a control of unseen 0s and
    # 1s, which stays at 0); far below it, other inputs explain what training added and fewer are
    assert large["memorised"] >= 2 and small["memorised"] < large["memorised"] and large["control"] == 0
    assert (out / "law.png").stat().st_size > 10_000
    summary = json.loads((out / "law.json").read_text())
    assert len(summary["rows"]) == 2 and summary["settings"]["scale"] == "cpu-default"


def test_a_resumed_law_experiment_reuses_its_finished_runs(tmp_path, capsys):
    out = tmp_path / "law"
    args = ["experiment", "law", "-o", str(out), "--families", "random-features", "--ns", "5", "--ratios", "0.25",
            "--variants", "learned", "--iterations", "5", "--no-progress"]
    assert main(args) == 0
    row = out / "runs" / "random-features_n5_r0.25_s0_learned" / "row.json"
    before = row.read_text()
    row.write_text(before.replace('"memorised": 0', '"memorised": 3'))  # a finished row is read back, not run again
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "law-curve.json").read_text())["points"][0]["memorised"] == 3


@pytest.mark.parametrize("flag, value", [("--families", "resnet"), ("--ratios", "0,2"), ("--variants", "dual"), ("--data", "cifar")])
def test_the_law_experiment_refuses_bad_settings_in_one_line(tmp_path, capsys, flag, value):
    assert main(["experiment", "law", "-o", str(tmp_path / "x"), flag, value, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err
