"""Run folders owned by one run (issue 12): a second writer refused, SIGTERM leaves a resumable
checkpoint (exit 143), no silent overwrite, no resume from another victim's checkpoint, a stale
lock taken over; and output JSON without NaN/Infinity."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from exhume.cli import main
from exhume.files.runfolder import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def victims(tmp_path_factory, make_tiny_victim):
    """Two tiny victims (seeds 0 and 1: other training digits, other weights), copies of conftest.py's."""
    root = tmp_path_factory.mktemp("runfolder")
    for seed in (0, 1):
        shutil.copytree(make_tiny_victim(arch="mlp:16;bias=none;init=1e-3", epochs=30, seed=seed, test_size=20), root / f"victim{seed}")
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


def _lock_of(holder) -> str:
    import dataclasses

    return json.dumps(dataclasses.asdict(holder))


def test_a_lock_from_another_host_is_taken_over_only_with_force(victims, tmp_path, capsys):
    """A lock written on another machine sharing the folder: its process cannot be checked from here."""
    import dataclasses

    from exhume.files import runlock

    run = tmp_path / "run"
    assert main(_attack(victims / "victim0", run, "--iterations", "5")) == 0
    other = dataclasses.replace(runlock.me(), host="node-17.cluster", pid=1)  # pid 1 runs here: the host must decide
    (run / LOCK_NAME).write_text(_lock_of(other))
    capsys.readouterr()
    assert main(_attack(victims / "victim0", run, "--iterations", "10", "--resume")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "on host node-17.cluster" in err and "cannot check" in err and "--force" in err
    assert json.loads((run / LOCK_NAME).read_text())["host"] == "node-17.cluster" and _iteration(run) == 5
    train = ["train", "--arch", "mlp:8", "-n", "10", "--seconds", "1", "--no-progress", "-o", str(run)]
    assert main(train) == 2  # train's --force replaces a folder's victim or run, and takes a foreign lock over as attack's
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node-17.cluster" in err and "pass --force to take the folder over" in err
    for cmd in (["evaluate", str(run), "--against", str(victims / "victim0")], ["report", str(run)]):
        assert main(cmd) == 2  # their --force replaces an earlier evaluation or report, never a lock: they say how to free the folder
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "node-17.cluster" in err and "delete the lock file" in err and "--force" not in err
    # another PID namespace on this host (a container) cannot be checked either
    (run / LOCK_NAME).write_text(_lock_of(dataclasses.replace(runlock.me(), pid_ns="pid:[1]")))
    assert main(_attack(victims / "victim0", run, "--iterations", "10", "--resume")) == 2 and "cannot check" in capsys.readouterr().err
    (run / LOCK_NAME).write_text(_lock_of(other))
    assert main(_attack(victims / "victim0", run, "--iterations", "7", "--force")) == 0
    assert _iteration(run) == 7 and not (run / LOCK_NAME).exists() and not list(run.glob(f"{LOCK_NAME}*"))


def test_a_lock_is_stale_after_a_reboot_or_when_its_pid_was_reused():
    import dataclasses

    from exhume.files import runlock

    here = runlock.me()
    assert runlock.judge(here) == "live" and runlock.judge(runlock.parse(_lock_of(here).encode())) == "live"
    assert runlock.judge(dataclasses.replace(here, boot_id="0" * 36)) == "stale"  # the machine rebooted since
    assert runlock.judge(dataclasses.replace(here, start=(here.start or 0) + 1)) == "stale"  # same pid, another process
    assert runlock.judge(runlock.parse(str(os.getpid()).encode())) == "live"  # an old lock: a pid only, this host
    assert runlock.judge(runlock.parse(b"\x00garbage")) == "stale"


def _contender(folders: list[str], start, collected, result) -> None:
    """Round k: take over folders[k] with the other contender; the winner holds it until both have answered."""
    from exhume.errors import ExhumeError
    from exhume.files import runlock
    from exhume.files.runfolder import own_run_folder

    judge, first = runlock.judge, [True]

    def slow_judge(holder):  # both contenders judge the dead process's lock stale before either takes it over
        verdict = judge(holder)
        if first.pop() if first else False:
            time.sleep(0.02)
        return verdict

    runlock.judge = slow_judge  # in this forked child only
    for folder in folders:
        first[:] = [True]
        start.wait()
        try:
            with own_run_folder(folder, run_files=()):
                result.put("won")
                collected.wait()
        except ExhumeError as e:
            result.put(f"refused: {e}")
            collected.wait()


def test_two_racing_takeovers_of_a_stale_lock_leave_one_winner(tmp_path):
    """Both judge a dead process's lock stale, then take it over at once (50 times): exactly one holds the folder."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folders = [tmp_path / f"run{k}" for k in range(50)]
    for k, folder in enumerate(folders):  # old locks (a pid only) and new ones
        folder.mkdir()
        (folder / LOCK_NAME).write_text(str(dead.pid) if k % 2 else json.dumps({"host": os.uname().nodename, "pid": dead.pid,
                                                                                 "nonce": f"n{k}"}))
    start, collected, result = ctx.Barrier(3), ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=([str(f) for f in folders], start, collected, result)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        for folder in folders:
            start.wait(30)
            outcomes = sorted((result.get(timeout=30) for _ in procs), key=lambda o: o != "won")
            collected.wait(30)
            assert outcomes[0] == "won" and outcomes[1].startswith(f"refused: output folder {folder} is in use by another"), outcomes
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert all(not list(f.iterdir()) for f in folders)  # every lock and takeover token removed on release


def test_exhume_train_evaluate_and_report_refuse_a_folder_a_live_run_holds(victims, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_attack(victims / "victim0", run, "--iterations", "5")) == 0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run / LOCK_NAME).write_text(str(holder.pid))
        capsys.readouterr()
        for cmd in (["train", "--arch", "mlp:8", "-n", "10", "--seconds", "1", "--no-progress", "-o", str(run)],
                    ["evaluate", str(run), "--against", str(victims / "victim0"), "--pool-size", "20"], ["report", str(run)]):
            assert main(cmd) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"pid {holder.pid}" in err and "in use by another exhume run" in err
        assert not (run / "victim.json").exists() and not (run / "evaluation").exists() and not (run / "report.html").exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["evaluate", str(run), "--against", str(victims / "victim0"), "--pool-size", "20"]) == 0
    assert (run / "evaluation" / "metrics.json").is_file() and not (run / LOCK_NAME).exists()


def test_the_audit_writes_its_evaluation_and_report_under_its_own_lock(victims, tmp_path, monkeypatch):
    import exhume
    import exhume.report
    from exhume.files import runlock

    victim = exhume.load_victim(victims / "victim0")
    train = victim.load_train_set()
    out, seen = tmp_path / "audit", []
    real = exhume.report.write_report

    def watched(run, *args, **kwargs):
        holder = runlock.parse((out / LOCK_NAME).read_bytes())
        seen.append((holder.pid, (out / "evaluation" / "metrics.json").is_file()))
        return real(run, *args, **kwargs)

    monkeypatch.setattr(exhume.report, "write_report", watched)
    labels = (train.y.numpy() > 0).astype(np.int64)
    exhume.audit(victim.model, (train.x.numpy(), labels), train.x.numpy()[:6, :, ::-1].copy(), loss="logistic", weight_decay=5e-3,
                 normalize=(train.mean, 1.0), attack_args={"iterations": 5, "restarts": 1}, progress=False, out=out)
    assert seen == [(os.getpid(), True)] and (out / "report.html").is_file() and not (out / LOCK_NAME).exists()
