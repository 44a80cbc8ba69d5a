"""The CLI end to end on a tiny configuration, and its one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from exhume.cli import main


def test_train_attack_evaluate_end_to_end(tmp_path, capsys):
    v, a = tmp_path / "victim", tmp_path / "attack"
    assert main(["train", "-o", str(v), "-n", "10", "--arch", "mlp:32;init=1e-4", "--epochs", "300", "--seconds", "30", "--no-progress"]) == 0
    layers = json.loads((v / "victim.json").read_text())["metrics"]["layers"]  # where the span shows, printed and recorded
    assert layers["n"] == 10 and layers["finding"] in capsys.readouterr().out
    assert main(["attack", str(v), "-o", str(a), "--iterations", "60", "-p", "lr=0.5", "--checkpoint-every", "20", "--restarts", "1", "--no-progress"]) == 0
    assert (a / "reconstruction.safetensors").exists() and (a / "checkpoint.pt").exists()
    assert main(["attack", str(v), "-o", str(a), "--iterations", "80", "-p", "lr=0.5", "--checkpoint-every", "20", "--restarts", "1",
                 "--resume", "--no-progress"]) == 0
    recon = json.loads((a / "reconstruction.json").read_text())
    assert recon["summary"]["iterations"] == 80 and recon["config"]["m"] == 20
    assert main(["evaluate", str(a), "--against", str(v), "--pool-size", "50"]) == 0
    out = capsys.readouterr().out
    assert "MEMORISED" in out and "SSIM >= 0.4 (one-to-one, Hungarian)" in out and "VERDICT" in out
    metrics = json.loads((a / "evaluation" / "metrics.json").read_text())
    for key in ("ssim>=0.4", "ssim>=0.5", "one_to_one_ssim>=0.4", "memorised", "pool_size", "ssim_window"):
        assert key in metrics
    assert metrics["pool_size"] == 50 and metrics["n_train"] == 10
    assert re.search(rf"support estimate\)\s+~{metrics['support_estimate']:.0f} / 10\n", out)
    for fig in ("best_pairs.png", "worst_pairs.png", "ssim_vs_margin.png", "ssim_sorted.png", "candidates.png"):
        assert (a / "evaluation" / fig).stat().st_size > 1000


@pytest.mark.parametrize(
    "argv, message",
    [
        (["attack", "/nonexistent/victim", "-o", "/tmp/x"], "does not exist"),
        (["train", "-o", "/tmp/exhume-never", "--task", "banana"], "unknown task"),
        (["train", "-o", "/tmp/exhume-never", "--data", "imagenet"], "imagenet"),
        (["train", "-o", "/tmp/exhume-never", "--arch", "transformer:3"], "unknown architecture"),
        (["demo", "-o", "/tmp/exhume-never", "--device", "banana"], "unknown device"),
    ],
)
def test_user_errors_are_one_line_without_traceback(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_unknown_method_and_parameter(tmp_path, capsys):
    v = tmp_path / "victim"
    assert main(["train", "-o", str(v), "-n", "4", "--arch", "mlp:8", "--epochs", "5", "--no-progress"]) == 0
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "--method", "magic"]) == 2
    assert "unknown attack method 'magic'" in capsys.readouterr().err
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "-p", "speed=3"]) == 2
    assert "no parameter(s) speed" in capsys.readouterr().err
    # the victim's facts are the threat model's (stated, never against its metadata), the run's bounds its own flags
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "--weight-decay", "0.5", "--iterations", "2"]) == 2
    assert "weight_decay 0.5 was stated, but the victim's metadata records 0.005" in capsys.readouterr().err
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "-p", "log_every=0"]) == 2
    assert "log_every: expected an integer" in capsys.readouterr().err
    assert main(["attack", str(v), "-o", str(tmp_path / "a"), "--max-seconds", "0"]) == 2
    assert "max_seconds must be a positive number of seconds, got 0.0" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "exhume", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "demo" in r.stdout and "evaluate" in r.stdout
