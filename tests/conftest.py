"""Shared fixtures: tiny victims trained once per test run; one torch thread per process.

`make test` runs the suite on two xdist workers (``-n 2``). Every test process, and every process a
test starts, runs one torch thread: two workers on two cores then run two threads, not four (the
tiny victims here gain nothing from a second thread, and a loaded machine loses much to it). A victim
folder is trained by the first worker that asks for it and read by the other (a file lock in the
run's shared temporary folder), so each is trained once per test run.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"  # before torch is imported; inherited by child processes

import pytest  # noqa: E402
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402

torch.set_num_threads(1)


def _shared_tmp(tmp_path_factory) -> Path:
    """This run's temporary folder, shared by the xdist workers (each worker's own is one level below)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def make_tiny_victim(tmp_path_factory):
    """``make_tiny_victim(n=10, arch=..., epochs=300, seed=0, test_size=50, lr=0.2)``: the folder of an MNIST
    odd/even victim (logistic loss, full-batch GD, weight decay 5e-3), trained on one thread the first
    time these settings are asked for in this test run, and the same folder afterwards (load it with
    ``exhume.load_victim``; do not write into it)."""
    root = _shared_tmp(tmp_path_factory) / "victims"
    root.mkdir(exist_ok=True)

    def build(n: int = 10, arch: str = "mlp:32;bias=none;init=1e-3", epochs: int = 300, seed: int = 0,
              test_size: int = 50, lr: float = 0.2) -> Path:
        from exhume.victim import TrainConfig, make_victim

        name = re.sub(r"[^A-Za-z0-9.=,-]+", "_", f"n{n}-{arch}-e{epochs}-s{seed}-t{test_size}-lr{lr}")
        folder = root / name
        with FileLock(str(root / f"{name}.lock")):
            if not folder.is_dir():
                threads = torch.get_num_threads()
                torch.set_num_threads(1)  # the same bits whichever worker trains it
                try:
                    cfg = TrainConfig(loss="logistic", optimizer="gd", lr=lr, weight_decay=5e-3, max_epochs=epochs)
                    victim = make_victim("mnist", "odd-even", n, arch, cfg, seed=seed, progress=False, test_size=test_size)
                finally:
                    torch.set_num_threads(threads)
                part = root / f"{name}.part"
                shutil.rmtree(part, ignore_errors=True)
                victim.save(part)
                part.rename(folder)
        return folder

    return build


@pytest.fixture(scope="session")
def victim_dir(make_tiny_victim) -> Path:
    """The common tiny victim: 10 digits, a bias-free 784-32-1 MLP, 300 epochs."""
    return make_tiny_victim()


@pytest.fixture(scope="session")
def leaky_victim_dir(make_tiny_victim) -> Path:
    """A tiny victim that truly leaks: 20 digits, 784-32-1 bias-free, 400 epochs (9 to 11 of its 20
    digits memorised by two 1,500-iteration kkt restarts, none of the control; test_audit.py)."""
    return make_tiny_victim(n=20, epochs=400, test_size=100)


@pytest.fixture
def one_thread():
    """One torch thread for a test (as each forked portfolio worker gets): comparable bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
