"""Run folders owned by one run (issue 12): a second writer refused, SIGTERM leaves a resumable
checkpoint (exit 143), no silent overwrite, no resume from another victim's checkpoint, a stale
lock taken over; and output JSON without NaN/Infinity."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from exhume.cli import main
from exhume.files.runfolder import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def victims(tmp_path_factory):
    from exhume.victim import TrainConfig, make_victim

    root = tmp_path_factory.mktemp("runfolder")
    cfg = TrainConfig(loss="logistic", optimizer="gd", lr=0.2, weight_decay=5e-3, max_epochs=30, max_seconds=10)
    for seed in (0, 1):
        torch.manual_seed(seed)
        make_victim("mnist", "odd-even", 10, "mlp:16;bias=none;init=1e-3", cfg, seed=seed, progress=False,
                    test_size=20).save(root / f"victim{seed}")
    return root


def _attack(victim: Path, run: Path, *extra: str) -> list[str]:
    # one run (--restarts 1): these tests are about the single run's folder, lock and checkpoint
    return ["attack", str(victim), "-o", str(run), "--no-progress", "--restarts", "1", "-p", "checkpoint_every=10", *extra]


def _iteration(run: Path) -> int:
    return int(torch.load(run / "checkpoint.pt", weights_only=True)["state"]["iteration"])


def test_second_writer_refused_and_sigterm_leaves_a_resumable_checkpoint(victims, tmp_path, capsys):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "exhume", *_attack(victims / "victim0", run, "--iterations", "1000000", "--max-seconds", "120")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while not (run / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert (run / "checkpoint.pt").exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in 90 s"
        # a second attack on the same folder is refused while the first runs
        assert main(_attack(victims / "victim0", run, "--iterations", "5", "--force")) == 2
        assert "in use by another exhume run" in capsys.readouterr().err
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "terminated (SIGTERM)" in lines[0] and "Traceback" not in err
    saved = _iteration(run)
    assert saved >= 10 and not (run / LOCK_NAME).exists() and not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp"))
    # --resume continues from the checkpoint SIGTERM left
    assert main(_attack(victims / "victim0", run, "--iterations", str(saved + 5), "--resume")) == 0
    recon = json.loads((run / "reconstruction.json").read_text())
    assert recon["summary"]["iterations"] == saved + 5


def test_overwrite_refused_resume_checks_the_victim(victims, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_attack(victims / "victim0", run, "--iterations", "20")) == 0
    capsys.readouterr()
    before = (run / "checkpoint.pt").read_bytes()
    assert main(_attack(victims / "victim0", run, "--iterations", "20")) == 2
    assert "already holds a run" in capsys.readouterr().err and (run / "checkpoint.pt").read_bytes() == before
    # a checkpoint written for victim0 is refused for victim1 (same architecture, other weights)
    assert main(_attack(victims / "victim1", run, "--iterations", "30", "--resume")) == 2
    assert "written for another victim" in capsys.readouterr().err
    assert main(_attack(victims / "victim0", run, "--iterations", "30", "--resume")) == 0
    assert _iteration(run) == 30
    # --force replaces the run
    assert main(_attack(victims / "victim1", run, "--iterations", "10", "--force")) == 0
    assert _iteration(run) == 10
    # a lock left by a dead process is taken over
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / LOCK_NAME).write_text(str(dead.pid))
    assert main(_attack(victims / "victim1", run, "--iterations", "20", "--resume")) == 0
    assert _iteration(run) == 20 and not (run / LOCK_NAME).exists()


def test_output_json_has_no_nan_or_infinity(tmp_path):
    from exhume.files.jsonio import write_json

    write_json(tmp_path / "x.json", {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -math.inf}, "e": 2})

    def refuse(token):
        raise AssertionError(f"{token} written into JSON")

    assert json.loads((tmp_path / "x.json").read_text(), parse_constant=refuse) == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2}
    assert not list(tmp_path.glob(".*tmp"))


def test_evaluate_refuses_a_victim_the_run_was_not_attacked_from(victims, tmp_path, capsys):
    import exhume
    from exhume.errors import VictimError

    run, pooled = tmp_path / "run", tmp_path / "pooled"
    assert main(_attack(victims / "victim0", run, "--iterations", "5")) == 0
    assert main(["attack", str(victims / "victim0"), "-o", str(pooled), "--no-progress", "--restarts", "2", "--workers", "1",
                 "--iterations", "5"]) == 0
    capsys.readouterr()
    for folder in (run, pooled):  # one run and a portfolio record the weights they attacked
        assert main(["evaluate", str(folder), "--against", str(victims / "victim1"), "--pool-size", "20"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(folder) in err and str(victims / "victim1") in err and "another victim" not in err
        assert not (folder / "evaluation").exists()
    assert main(["evaluate", str(run), "--against", str(victims / "victim0"), "--pool-size", "20"]) == 0
    # the Python API refuses the same victim
    with pytest.raises(VictimError, match="not from victim"):
        exhume.evaluate(exhume.load_reconstruction(run), exhume.load_victim(victims / "victim1"), pool_size=20, figures=False)
    # a portfolio saved before reconstruction.json recorded the fingerprint: OUT/victim.fingerprint is read
    meta = json.loads((pooled / "reconstruction.json").read_text())
    del meta["victim_fingerprint"]
    (pooled / "reconstruction.json").write_text(json.dumps(meta))
    assert exhume.load_reconstruction(pooled).victim_fingerprint == (pooled / "victim.fingerprint").read_text().strip()
    # a run with no recorded fingerprint (older runs) is evaluated as before
    (pooled / "victim.fingerprint").unlink()
    assert main(["evaluate", str(pooled), "--against", str(victims / "victim1"), "--pool-size", "20"]) == 0


def test_force_never_replaces_a_folder_a_live_process_holds(victims, tmp_path, capsys):
    pooled, demo = tmp_path / "pooled", tmp_path / "demo"
    portfolio = ["attack", str(victims / "victim0"), "-o", str(pooled), "--no-progress", "--restarts", "2", "--workers", "1",
                 "--iterations", "5"]
    assert main(portfolio) == 0
    before = {p: p.read_bytes() for p in pooled.rglob("*") if p.is_file()}
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (pooled / LOCK_NAME).write_text(str(holder.pid))
        capsys.readouterr()
        for cmd in (portfolio + ["--force"], _attack(victims / "victim1", pooled, "--iterations", "5", "--force")):
            assert main(cmd) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and str(pooled) in err and f"pid {holder.pid}" in err and "--force replaces only" in err
        assert {p: p.read_bytes() for p in pooled.rglob("*") if p.is_file()} == {**before, pooled / LOCK_NAME: str(holder.pid).encode()}
        # the demo (which always replaces its attack) is refused before it retrains OUT/victim
        demo.mkdir()
        (demo / LOCK_NAME).write_text(str(holder.pid))
        assert main(["demo", "-o", str(demo), "--no-progress", "--train-seconds", "1", "--attack-seconds", "1"]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err and [p.name for p in demo.iterdir()] == [LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone, --force replaces the run
    assert main(portfolio + ["--force", "--seed", "3"]) == 0
    assert json.loads((pooled / "reconstruction.json").read_text())["seed"] == 3 and not (pooled / LOCK_NAME).exists()
