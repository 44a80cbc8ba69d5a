"""torch.save files (attack and training checkpoints): atomic writes, weights-only reads under a size limit."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest
import torch

from exhume.errors import ExhumeError
from exhume.files import torchfile
from exhume.files.torchfile import load_torch, save_torch


class _Payload:
    """Unpickling this would write a file: a weights-only load must refuse it without running it."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_round_trip_leaves_no_temporary_file(tmp_path):
    save_torch(tmp_path / "c.pt", {"x": torch.arange(3.0), "n": 4, "s": "ok", "h": [[1, 0.5]]})
    back = load_torch(tmp_path / "c.pt", "cannot resume", "exhume checkpoint")
    assert torch.equal(back["x"], torch.arange(3.0)) and back["n"] == 4 and back["s"] == "ok" and back["h"] == [[1, 0.5]]
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_truncated_missing_and_oversized_files_are_one_clear_error(tmp_path, monkeypatch):
    save_torch(tmp_path / "c.pt", {"x": torch.zeros(1000)})
    data = (tmp_path / "c.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ExhumeError, match=r"cannot resume from .*cut\.pt: not a readable exhume checkpoint"):
        load_torch(tmp_path / "cut.pt", "cannot resume", "exhume checkpoint")
    with pytest.raises(ExhumeError, match=r"missing\.pt: cannot read it.*; delete it"):
        load_torch(tmp_path / "missing.pt", "cannot resume", "exhume checkpoint", "delete it")
    monkeypatch.setattr(torchfile, "LIMITS", dataclasses.replace(torchfile.LIMITS, torch_file_bytes=100))
    with pytest.raises(ExhumeError, match=r"c\.pt: \d+ bytes; expected exhume checkpoint of at most 100 bytes"):
        load_torch(tmp_path / "c.pt", "cannot resume", "exhume checkpoint")


def test_a_pickled_object_is_refused_without_running_it(tmp_path):
    target = tmp_path / "ran"
    with (tmp_path / "evil.pt").open("wb") as f:
        pickle.dump({"x": _Payload(target)}, f, protocol=2)
    torch.save({"x": _Payload(target)}, tmp_path / "evil_zip.pt")
    for name in ("evil.pt", "evil_zip.pt"):  # the legacy pickle format and torch.save's zip format
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ExhumeError) as err:
                load_torch(tmp_path / name, "cannot resume", "exhume checkpoint")
        text = str(err.value)  # exhume's one line only: no torch warning, no torch advice to load it unsafely
        assert caught == [] and "\n" not in text and "\x1b" not in text and "two options" not in text
        assert f"{name}: it holds pickled Python objects" in text and "never unpickled" in text
    assert not target.exists()


def test_a_training_checkpoint_without_its_fields_is_refused(tmp_path):
    from torch import nn

    from exhume.victim import TrainConfig, train_victim

    x, y = torch.rand(6, 4), torch.tensor([1.0, -1.0] * 3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1), nn.Flatten(0))
    cfg = TrainConfig(loss="logistic", lr=0.1, max_epochs=2)
    for payload in ([1, 2, 3], {"epoch": 1, "elapsed": 0.5, "history": [], "settings": [1]}):
        save_torch(tmp_path / "t.pt", payload)
        with pytest.raises(ExhumeError, match="malformed field.*delete it to train from the start"):
            train_victim(model, x, y, cfg, progress=False, checkpoint=tmp_path / "t.pt", resume=True)


def test_a_checkpoint_above_the_file_cap_resumes_when_its_size_is_what_the_run_writes(tmp_path, monkeypatch):
    """The cap follows the shapes being restored: a run's own large checkpoint loads; a file far above them does not."""
    from exhume.attacks.engine.checkpoint import load_checkpoint, save_checkpoint

    monkeypatch.setattr(torchfile, "LIMITS", dataclasses.replace(torchfile.LIMITS, torch_file_bytes=10_000))
    monkeypatch.setattr(torchfile, "CHECKPOINT_SLACK", 1_000)
    x = torch.randn(50_000, requires_grad=True)
    opt = torch.optim.Adam([x])
    x.sum().backward()
    opt.step()
    save_checkpoint(tmp_path / "c.pt", {"x": x}, {"opt": opt}, {"iteration": 1, "elapsed": 0.5, "history": []})
    size = (tmp_path / "c.pt").stat().st_size
    assert size > 30 * torchfile.LIMITS.torch_file_bytes  # 600 kB: three tensors of 50,000 floats
    y = torch.zeros(50_000, requires_grad=True)
    state = load_checkpoint(tmp_path / "c.pt", {"x": y}, {"opt": torch.optim.Adam([y])}, expect={})
    assert state["iteration"] == 1 and torch.equal(y.detach(), x.detach())
    # a checkpoint for a run that restores one small tensor is held to that run's size
    z = torch.zeros(10, requires_grad=True)
    with pytest.raises(ExhumeError, match=r"c\.pt: \d+ bytes; expected exhume checkpoint of at most 10000 bytes"):
        load_checkpoint(tmp_path / "c.pt", {"x": z}, {"opt": torch.optim.Adam([z])}, expect={})
