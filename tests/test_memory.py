"""Memory known before the first step: each attack's estimate against the memory the run takes, and a refusal in
one line, before anything is allocated, that names the estimate and settings that fit."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from exhume.attacks import get_attack
from exhume.attacks.engine import memory as mem
from exhume.models import build_model
from exhume.victim import AttackerView

LINUX = sys.platform.startswith("linux") and Path("/proc/self/clear_refs").exists()


def _rss(key: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(key)


def _view(arch: str, shape: tuple[int, ...], task: str = "binary", n: int = 100) -> AttackerView:
    torch.manual_seed(0)
    k = 10 if task == "multiclass" else 1
    return AttackerView(model=build_model(arch, shape, k).eval(), task=task, input_shape=shape, mean=torch.full(shape, 0.2),
                        weight_decay=5e-3, num_classes=k if task == "multiclass" else None, n_train_hint=n)


def test_activations_are_counted_per_input_for_any_module():
    class Odd(torch.nn.Module):  # a functional ReLU and a reshape: no leaf module would see them
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(12, 7)

        def forward(self, x):
            return torch.relu(self.a(x.reshape(x.shape[0], -1))).sum(1)

    acts = mem.activation_elements(Odd(), (3, 4))
    assert acts.per_input == 7 + 7 + 1  # linear, relu, sum; the reshape is a view


# measured in a fresh interpreter: a test process that ran other tests first holds freed memory and glibc settings
# (exhume.heap) that move its resident set, and a suite's worker once measured 99 MiB added against 60 alone
PROBE = """
import json, sys
from pathlib import Path
import torch
from exhume.attacks import get_attack
from exhume.models import build_model
from exhume.victim import AttackerView

method, arch, shape, kwargs, out = json.loads(sys.argv[1])
shape = tuple(shape)
torch.set_num_threads(1)
torch.manual_seed(0)
view = AttackerView(model=build_model(arch, shape, 1).eval(), task="binary", input_shape=shape, mean=torch.full(shape, 0.2),
                    weight_decay=5e-3, n_train_hint=100)
atk = get_attack(method, iterations=2, **kwargs)
estimate = atk.peak_memory_bytes(view)
torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # imports what the first optimiser imports

def rss(key="VmRSS"):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

before = rss()
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
atk.run(view, out=out, progress=False, checkpoint_every=1)
print(json.dumps([estimate, rss("VmHWM") - before, before]))
"""


@pytest.mark.skipif(not LINUX, reason="the peak resident set is read from /proc (Linux)")
@pytest.mark.parametrize("method, arch, shape, kwargs", [
    ("kkt", "mlp:100", (1, 28, 28), {"m": 1500}),
    ("kkt", "cnn:16,32;fc=64", (1, 28, 28), {"m": 300}),
])
def test_the_estimate_is_near_the_peak_the_run_adds(method, arch, shape, kwargs, tmp_path):
    """The measured peak resident set (VmHWM, reset before the run) above the process's size before it: the
    estimate within 30 % of the process's peak, and of what the run added within the allocator's spread."""
    import json
    import subprocess

    arg = json.dumps([method, arch, list(shape), kwargs, str(tmp_path / "run")])
    out = subprocess.run([sys.executable, "-c", PROBE, arg], capture_output=True, text=True, check=True)
    estimate, added, before = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.7 * (before + added) <= before + estimate <= 1.3 * (before + added), (estimate, added, before)
    assert 0.6 * added <= estimate <= 1.6 * added, (estimate / 2**20, added / 2**20)


def test_every_registered_attack_gives_an_estimate_that_grows_with_its_candidates():
    from exhume.attacks import ATTACKS

    views = {"binary": _view("mlp:32", (1, 12, 12)), "multiclass": _view("convnet:8,8;fc=16", (1, 12, 12), "multiclass")}
    recipe = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "batch_size": 4, "epochs": 1, "sampler": "sequential"}
    for name, cls in ATTACKS.items():
        knob = next((k for k, kind in cls.memory_knobs.items() if kind == "count"), None)
        if knob is None:  # one candidate per training point (the exact run): no count to advise, the training set's size
            assert [cls().candidate_count(n) for n in (8, 800)] == [8, 800], f"{name} names no count setting for a refusal's advice"
            knob = "n_guess"
        candidates = [replace(v, start={k: t + 0.01 for k, t in v.model.state_dict().items()}, training=recipe) if cls.uses_start
                      else v for v in views.values()]  # an attack that trains from a start gets one, and the recipe
        view = next(v for v in candidates if _accepts(cls(), v))
        small, large = cls(**{knob: 8}).peak_memory_bytes(view), cls(**{knob: 800}).peak_memory_bytes(view)
        assert 0 < small < large, name


def _accepts(atk, view) -> bool:
    try:
        atk.check(view)
    except Exception:  # noqa: BLE001
        return False
    return True


def test_an_attack_above_the_memory_available_is_refused_in_one_line_before_allocating(tmp_path, capsys, monkeypatch):
    from exhume.attacks import kkt
    from exhume.cli import main
    from exhume.victim import TrainConfig, make_victim

    make_victim("mnist", "odd-even", 10, "mlp:16", TrainConfig(max_epochs=5), progress=False, test_size=0).save(tmp_path / "v")

    def no_allocation(*args, **kwargs):
        raise AssertionError("the attack started allocating")

    monkeypatch.setattr(kkt.KKTAttack, "problem", no_allocation)
    monkeypatch.setattr(mem, "available_bytes", lambda device="cpu": 300 << 20)
    for extra in ([], ["--restarts", "1"]):  # the portfolio (restarts side by side) and one run
        run = tmp_path / f"run{len(extra)}"
        assert main(["attack", str(tmp_path / "v"), "-o", str(run), "--no-progress", "--workers", "2", "-p", "m=200000",
                     "--dtype", "float64", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "needs about" in err and "but 300 MiB is available" in err and "m=200,000, float64" in err
        assert "settings that fit: " in err and "-p dtype=float32 -p m=" in err and not (run / "checkpoint.pt").exists()
    fits = int(err.split("settings that fit: -p m=")[1].split(" ")[0])
    assert 1 <= fits < 200_000 and get_attack("kkt", m=fits, dtype="float64").peak_memory_bytes(
        AttackerView(model=build_model("mlp:16", (1, 28, 28), 1), task="binary", input_shape=(1, 28, 28),
                     mean=torch.zeros(1, 28, 28))) <= 300 << 20


def test_the_memory_available_reads_the_machine_and_its_cgroup():
    room = mem.available_bytes("cpu")
    assert room is None or 0 < room <= 1 << 50


def test_a_portfolio_counts_its_workers_and_names_how_many_fit(monkeypatch):
    import exhume

    view = _view("mlp:64", (1, 28, 28))
    one = get_attack("kkt", m=400).peak_memory_bytes(view)
    monkeypatch.setattr(mem, "available_bytes", lambda device="cpu": int(2.5 * one))
    with pytest.raises(mem.MemoryRefused) as err:
        exhume.attack(view, "kkt", m=400, restarts=4, workers=4, iterations=5, progress=False)
    text = str(err.value)
    assert "\n" not in text and "kkt attack's portfolio" in text and "(4 runs at once" in text
    assert "settings that fit: --workers 2 (runs at once)" in text
    r = exhume.attack(view, "kkt", m=400, restarts=2, workers=2, iterations=5, progress=False)  # two side by side fit
    assert r.summary["restarts_complete"] == 2
