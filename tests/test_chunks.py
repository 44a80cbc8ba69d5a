"""Long experiments in chunks: a victim's training checkpoints and resumes to the same weights, a
checkpoint for other settings or a corrupt one is refused with one line, and a kkt experiment cut
into chunks by ``--chunk-seconds`` ends with the table of an uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from exhume.cli import main
from exhume.errors import ExhumeError
from exhume.victim import TrainConfig
from exhume.victim.train import train_victim

CFG = TrainConfig(loss="logistic", lr=0.1, weight_decay=1e-3, max_epochs=300)


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(24, 1, 8, 8, generator=g), (torch.arange(24) % 2 * 2 - 1).float()


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))


def _cut_at(model: nn.Module, call: int) -> None:
    """Ctrl-C during the ``call``-th forward pass (the epoch ``call`` never completes)."""
    seen = [0]

    def hook(module, inputs):
        seen[0] += 1
        if seen[0] == call:
            raise KeyboardInterrupt

    model.register_forward_pre_hook(hook)


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    x, y = _data()
    ref = _model()
    ref_metrics = train_victim(ref, x, y, CFG, progress=False)
    cut = _model()
    _cut_at(cut, 120)
    with pytest.raises(KeyboardInterrupt):
        train_victim(cut, x, y, CFG, progress=False, checkpoint=tmp_path / "t.pt")
    assert torch.load(tmp_path / "t.pt", weights_only=True)["epoch"] == 119
    resumed = _model()  # a fresh initialisation: everything comes from the checkpoint
    metrics = train_victim(resumed, x, y, CFG, progress=False, checkpoint=tmp_path / "t.pt", resume=True)
    assert metrics["resumed_from_epoch"] == 119 and metrics["epochs"] == ref_metrics["epochs"] == 300
    assert metrics["loss_history"] == ref_metrics["loss_history"]
    for a, b in zip(ref.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    again = _model()  # without resume=True the checkpoint is ignored and overwritten
    assert "resumed_from_epoch" not in train_victim(again, x, y, CFG, progress=False, checkpoint=tmp_path / "t.pt")


def test_a_checkpoint_for_other_settings_or_a_corrupt_one_is_refused(tmp_path):
    x, y = _data()
    model = _model()
    train_victim(model, x, y, TrainConfig(loss="logistic", lr=0.1, weight_decay=1e-3, max_epochs=5), progress=False,
                 checkpoint=tmp_path / "t.pt")
    other_lr = TrainConfig(loss="logistic", lr=0.05, weight_decay=1e-3, max_epochs=10)
    with pytest.raises(ExhumeError, match=r"written with lr=0\.1, this run has lr=0\.05"):
        train_victim(_model(), x, y, other_lr, progress=False, checkpoint=tmp_path / "t.pt", resume=True)
    with pytest.raises(ExhumeError, match="written with other images or labels"):
        train_victim(_model(), x, -y, CFG, progress=False, checkpoint=tmp_path / "t.pt", resume=True)
    wider = nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 1), nn.Flatten(0))
    with pytest.raises(ExhumeError, match="does not fit this model"):
        train_victim(wider, x, y, CFG, progress=False, checkpoint=tmp_path / "t.pt", resume=True)
    data = (tmp_path / "t.pt").read_bytes()
    (tmp_path / "t.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ExhumeError, match="not a readable exhume training checkpoint"):
        train_victim(_model(), x, y, CFG, progress=False, checkpoint=tmp_path / "t.pt", resume=True)


def _cases():
    from exhume.experiments.kkt_study import Case

    return [Case(f"n={n}", n=n, arch="mlp:32,32;bias=none;init=1e-4") for n in (10, 16)]


EPOCHS, ITERATIONS = 300, 200  # each case's victim's training and its attack


def _run(out, resume: bool):
    from types import SimpleNamespace

    from exhume.experiments.kkt_study import _run_all

    args = SimpleNamespace(seed=0, device="cpu", resume=resume)
    rows, arrays = _run_all(_cases(), args, EPOCHS, ITERATIONS, out, progress=False)
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows], arrays


def test_kkt_cases_in_chunks_end_with_the_uninterrupted_table(tmp_path, monkeypatch):
    """Training, attack and finished cases all resume: short chunks give the rows of one long run. (Each
    chunk is a quarter of a second longer than the last, so that a loaded machine still gets through the
    steps that are not checkpointed: loading the data, evaluating a case.) Eager steps throughout: the traced
    replay starts after a time, which a loaded machine reaches in the long run and not in the chunks, and its
    float rounding differs from the eager step's in the last bits. A chunk's end lands in each victim's training for
    sure (the timer's signal at the 100th and the 300th epoch, the second case's 100th), whatever the machine's speed."""
    import signal

    from exhume.experiments.registry import ChunkEnd, chunk_deadline
    from exhume.victim import train as training

    monkeypatch.setattr("exhume.attacks.kkt.settings.traces", lambda iterations, seconds: False)

    whole, whole_arrays = _run(tmp_path / "whole", resume=False)

    def epoch(*args, real=training._epoch, calls=[]):  # noqa: B006 - counts the calls
        calls.append(1)
        if len(calls) in (100, EPOCHS + 100):
            signal.raise_signal(signal.SIGALRM)  # held by the epoch, delivered after it: ChunkEnd
        return real(*args)

    monkeypatch.setattr(training, "_epoch", epoch)
    chunks = 0
    while True:
        chunks += 1
        assert chunks < 40
        try:
            with chunk_deadline(0.5 + 0.25 * chunks):
                rows, arrays = _run(tmp_path / "chunked", resume=chunks > 1)
            break
        except ChunkEnd:
            pass
    resumed = [json.loads(p.read_text())["metrics"].get("resumed_from_epoch") for p in sorted((tmp_path / "chunked").glob("*/victim/victim.json"))]
    assert chunks >= 3 and len(resumed) == 2 and all(resumed), ("each victim's training was cut and resumed", resumed)
    assert rows == whole
    for a, b in zip(arrays, whole_arrays):
        assert all((a[k] == b[k]).all() for k in ("ssim", "margin", "memorised"))


def test_chunk_seconds_on_the_command_line(tmp_path, capsys):
    args = ["experiment", "multiclass", "--iterations", "20", "--epochs", "30", "--no-progress", "-o", str(tmp_path / "m")]
    assert main([*args, "--chunk-seconds", "0.2"]) == 3
    assert "run the same command with --resume to continue" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert json.loads((tmp_path / "m" / "multiclass.json").read_text())["rows"][0]["classes"] == 2
    assert main([*args, "--chunk-seconds", "-1"]) == 2
    assert "--chunk-seconds must be a positive number" in capsys.readouterr().err


def test_an_interrupt_during_a_step_arrives_after_it():
    import signal

    from exhume.interrupts import whole_step

    done = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may run us with SIGINT ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            with whole_step():
                signal.raise_signal(signal.SIGINT)  # Ctrl-C in the middle of an update ...
                done.append("update")
                done.append("count")  # ... is delivered only once the step and its counter agree
        assert done == ["update", "count"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handlers are restored"
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with whole_step():
            signal.raise_signal(signal.SIGINT)  # an ignored signal stays ignored
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)



def test_an_interrupt_inside_a_checkpoint_write_stays_an_interrupt(tmp_path):
    """torch's zip writer turns an exception inside it into a RuntimeError: a chunk's end there would crash the run."""
    from exhume.experiments.registry import ChunkEnd
    from exhume.files.torchfile import save_torch

    writes = [0]
    real = torch.save

    def cut(obj, f, *a, **k):  # the chunk's end lands in the second write of the file
        class Cut:
            def write(self, b):
                writes[0] += 1
                if writes[0] == 2:
                    raise ChunkEnd
                return f.write(b)

            def __getattr__(self, name):
                return getattr(f, name)

        real(obj, Cut(), *a, **k)

    torch.save = cut
    try:
        with pytest.raises(ChunkEnd):
            save_torch(tmp_path / "t.pt", {"x": torch.zeros(100)})
    finally:
        torch.save = real
    assert list(tmp_path.iterdir()) == [], "no file, no temporary file"


def test_a_chunk_end_that_python_drops_is_raised_again():
    """A signal handler's exception inside a weakref callback (or a finaliser) is printed and dropped by Python."""
    import time
    import weakref

    from exhume.experiments.registry import ChunkEnd, chunk_deadline

    class Thing:
        pass

    start = time.perf_counter()
    with pytest.raises(ChunkEnd):
        with chunk_deadline(0.05):
            thing = Thing()
            ref = weakref.ref(thing, lambda r: time.sleep(0.2))  # the chunk's end lands in this callback
            del thing
            time.sleep(1.0)
    assert ref() is None and time.perf_counter() - start < 0.5

# The other experiments in chunks, at the tiniest settings each accepts. The victims that are trained for a time
# (init-study's) are the suite's tiny ones, copied into both runs: a time budget trains no two alike.
CHUNKED = {
    "init-study": ["-n", "10", "--grid", "1", "--kkt-iterations", "40", "--bilevel-iterations", "3", "--heldout", "10"],
    "tldr": ["--sizes", "10", "--epochs", "1", "--arch", "convnet:4;fc=8", "--steps", "8", "--samples-per-class", "1",
             "--methods", "tldr"],
    "dp": ["--settings", "minibatch", "-n", "10", "--epochs", "2", "--epsilons", "10", "--iterations", "20", "--no-clip-only",
           "--targets", "2"],
}


def _table(name: str, out) -> list:
    """What the experiment's table says, less wall times and file paths."""
    if name == "init-study":
        return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads((out / "table.json").read_text())["rows"]]
    if name == "dp":
        return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in json.loads((out / "dp.json").read_text())["rows"]]
    res = json.loads((out / "results.json").read_text())
    return [res["victim_signal_separation"],
            [{k: v for k, v in r.items() if not k.endswith("seconds") and k != "grid"} for r in res["runs"]]]


def _cut_attacks(out) -> set:
    """The attacks in ``out`` stopped part way: a checkpoint and no result yet."""
    return {str(p.parent) for p in out.rglob("checkpoint.pt")
            if not any((p.parent / f).is_file() for f in ("reconstruction.json", "row.json"))}


@pytest.mark.parametrize("name", sorted(CHUNKED))
def test_every_experiment_cut_into_chunks_ends_with_the_uninterrupted_table(name, tmp_path, capsys, monkeypatch,
                                                                            victim_dir, make_tiny_victim):
    """``--chunk-seconds`` cuts the run as Ctrl-C would (exit code 3, one line); the same command with ``--resume``
    goes on, and the last chunk's table is the one run's. The first chunk is a quarter of the uninterrupted run, each
    next one 1.6 times as long as the last, so that a loaded machine still gets through what is not checkpointed
    (loading the data, judging a finished run)."""
    import shutil
    import time

    if name == "dp":
        from _extras import need

        need("opacus", "dp")
    # the figures are drawn from the tables (tested in test_init_study_cli.py, test_tldr.py): not here
    monkeypatch.setattr("exhume.experiments.init_study._figures", lambda *a: [])
    monkeypatch.setattr("exhume.evaluation.trainlike.class_grid", lambda *a, **k: a[2])
    victims = {"init-study": {"victim-kkt": victim_dir, "victim-bilevel": make_tiny_victim(arch="affine", epochs=50, lr=0.5,
                                                                                           test_size=0)}}.get(name, {})
    argv = ["experiment", name, *CHUNKED[name], "--no-progress"]
    for run in ("whole", "chunked"):
        for folder, source in victims.items():
            shutil.copytree(source, tmp_path / run / folder)
    # first the uninterrupted run (which also imports what the experiment imports: a chunk's end inside an import,
    # harmless to the command that then exits, would break the next chunk run in this process)
    start = time.perf_counter()
    assert main([*argv, "-o", str(tmp_path / "whole"), *(["--resume"] if victims else [])]) == 0
    first = (time.perf_counter() - start) / 4  # the chunks' lengths follow this machine's speed
    # and the first chunk's end lands in an attack for sure: a timer's signal at its second step, as a real one would
    import signal

    from exhume.attacks.engine import loop

    def alarm_once(desc, total, max_seconds, start, elapsed, step, *args, real=loop.run_loop, fired=[], **kw):  # noqa: B006
        def stepped(i, *a):
            if i == start + 1 and not fired:
                fired.append(desc)
                signal.raise_signal(signal.SIGALRM)  # held by the step, delivered after it: ChunkEnd
            return step(i, *a)
        return real(desc, total, max_seconds, start, elapsed, stepped, *args, **kw)

    monkeypatch.setattr(loop, "run_loop", alarm_once)
    chunks, cut = 0, set()
    while True:
        chunks += 1
        assert chunks < 20
        code = main([*argv, "-o", str(tmp_path / "chunked"), "--chunk-seconds", f"{first * 1.6 ** (chunks - 1):.3g}",
                     *(["--resume"] if victims or chunks > 1 else [])])
        if code == 0:
            break
        err = capsys.readouterr().err
        assert code == 3 and err.count("\n") == 1 and "run the same command with --resume to continue" in err
        cut |= _cut_attacks(tmp_path / "chunked")
    assert chunks >= 2, "the run was really cut"
    assert _table(name, tmp_path / "chunked") == _table(name, tmp_path / "whole")
    assert cut, "an attack was cut and continued from its checkpoint"
