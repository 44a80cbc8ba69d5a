"""Victims: training, saving as a folder, and loading with clear errors on bad input."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from exhume.errors import ConfigError, VictimError
from exhume.models import MLP, build_model, parse_arch
from exhume.victim import AttackerView, TrainConfig, load_victim, make_victim


@pytest.fixture(scope="module")
def victim_dir(make_tiny_victim):
    """make_victim(...).save(folder) by conftest.py: 20 digits, lr 0.2, weight decay 5e-3, 300 epochs, seed 1."""
    return make_tiny_victim(n=20, arch="mlp:32,32;bias=first;init=1e-4", seed=1, test_size=100)


def test_victim_trains_to_fit_its_data_and_round_trips(victim_dir):
    v = load_victim(victim_dir)
    assert v.metrics["train_accuracy"] == 1.0
    assert v.task == "binary" and v.loss == "logistic" and v.weight_decay == 5e-3
    assert v.metrics["test_size"] == 100 and 0.5 < v.metrics["test_accuracy"] <= 1.0
    meta = json.loads((victim_dir / "victim.json").read_text())
    assert meta["arch"] == {"type": "mlp", "widths": [32, 32], "bias": "first", "init": 1e-4}
    assert meta["train_config"]["seed"] == 1 and meta["data_spec"]["n"] == 20
    # the training set is rebuilt from the spec and matches the saved indices
    train = v.train_set
    assert np.array_equal(np.sort(train.indices), np.sort(np.load(victim_dir / "train_indices.npy")))
    with torch.no_grad():
        assert torch.equal(torch.sign(v.model(train.centred)), train.y)
    # the images themselves are not saved
    assert sorted(p.name for p in victim_dir.iterdir()) == ["model.safetensors", "train_indices.npy", "victim.json"]


def test_attacker_view_holds_no_training_data(victim_dir):
    view = load_victim(victim_dir).attacker_view()
    assert isinstance(view, AttackerView)
    assert not any(hasattr(view, name) for name in ("train_set", "train_indices", "data_spec"))
    assert view.n_train_hint == 20 and view.weight_decay == 5e-3


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(VictimError, match="does not exist"):
        load_victim(tmp_path / "nope")


def _copy(victim_dir, tmp_path):
    dst = tmp_path / "v"
    dst.mkdir()
    for p in victim_dir.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_truncated_weights_are_a_clear_error(victim_dir, tmp_path):
    dst = _copy(victim_dir, tmp_path)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(VictimError, match="truncated"):
        load_victim(dst)


def test_a_pickle_in_place_of_safetensors_is_refused_not_executed(victim_dir, tmp_path):
    dst = _copy(victim_dir, tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))

    torch.save({"x": Evil()}, dst / "model.safetensors")
    with pytest.raises(VictimError, match="safetensors"):
        load_victim(dst)
    assert not marker.exists()


def test_nan_weights_are_refused(victim_dir, tmp_path):
    dst = _copy(victim_dir, tmp_path)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["net.0.weight"][0, 0] = float("nan")
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(VictimError, match="NaN"):
        load_victim(dst)


def test_mismatched_shapes_are_refused(victim_dir, tmp_path):
    dst = _copy(victim_dir, tmp_path)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["net.2.weight"] = torch.zeros(5, 5)
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(VictimError, match="net.2.weight"):
        load_victim(dst)


def test_corrupt_metadata_is_refused(victim_dir, tmp_path):
    dst = _copy(victim_dir, tmp_path)
    (dst / "victim.json").write_text("{not json")
    with pytest.raises(VictimError, match="victim.json"):
        load_victim(dst)


def test_architecture_specs():
    assert parse_arch("mlp:10,20;bias=all;init=0.01") == {"type": "mlp", "widths": [10, 20], "bias": "all", "init": 0.01}
    m = build_model("mlp:10;bias=first;init=1e-4", (1, 2, 2), 1)
    assert isinstance(m, MLP) and m(torch.zeros(3, 1, 2, 2)).shape == (3,)
    assert m.net[0].weight.abs().max() < 1e-2
    with pytest.raises(ConfigError, match="cnn pool must be"):
        build_model("cnn:3;pool=median", (1, 8, 8), 2)
    gelu = build_model("cnn:3;fc=4;act=gelu", (1, 8, 8), 2)  # a smooth activation everywhere, the same weights' shapes
    assert sum(isinstance(m, torch.nn.GELU) for m in gelu.modules()) == 2 and not any(isinstance(m, torch.nn.ReLU) for m in gelu.modules())
    assert [p.shape for p in gelu.parameters()] == [p.shape for p in build_model("cnn:3;fc=4", (1, 8, 8), 2).parameters()]
    with pytest.raises(ConfigError, match="cnn act must be one of relu, gelu, softplus"):
        build_model("cnn:3;act=tanh", (1, 8, 8), 2)
    with pytest.raises(ConfigError, match="image inputs"):
        build_model("cnn:3", (64,), 2)
    for bad, msg in [("rnn:3", "unknown architecture"), ("mlp:a,b", "integers"), ("mlp:", "at least one"),
                     ("mlp:3;bias", "key=value"), ("mlp:3;depth=2", "unknown architecture option")]:
        with pytest.raises(ConfigError, match=msg):
            parse_arch(bad)


def test_bad_training_settings_are_refused():
    with pytest.raises(ConfigError, match="unknown loss"):
        TrainConfig(loss="hinge")
    with pytest.raises(ConfigError, match="lr: expected a number > 0"):
        TrainConfig(lr=0)
    with pytest.raises(ConfigError, match="unknown optimizer"):
        TrainConfig(optimizer="rmsprop")


@pytest.mark.parametrize("field, value, needle", [
    ("lr", math.inf, "lr: expected a finite number, got inf"),
    ("lr", math.nan, "lr: expected a finite number, got nan"),
    ("weight_decay", math.inf, "weight_decay: expected a finite number, got inf"),
    ("weight_decay", -1e-3, "weight_decay: expected a number in [0.0, inf], got -0.001"),
    ("max_seconds", math.inf, "max_seconds: expected a finite number, got inf"),
    ("max_seconds", 0.0, "max_seconds: expected a number > 0, got 0.0"),
    ("max_epochs", 2.5, "max_epochs: expected an integer, got float 2.5"),
    ("loss_threshold", -1.0, "loss_threshold: expected a number in [0.0, inf], got -1.0"),
    ("residual_threshold", math.nan, "residual_threshold: expected a finite number, got nan"),
    ("log_every", 0, "log_every: expected an integer in [1, inf], got 0"),
])
def test_every_training_setting_is_checked_like_a_file_field(field, value, needle):
    """TrainConfig, make_victim (a config changed after it was built) and exhume train refuse in one line."""
    with pytest.raises(ConfigError) as err:
        TrainConfig(**{field: value})
    assert str(err.value) == needle
    cfg = TrainConfig()
    setattr(cfg, field, value)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        make_victim("mnist", "odd-even", 10, "mlp:8", cfg, progress=False, test_size=0)


@pytest.mark.parametrize("field, value, needle", [
    ("lr", math.inf, "lr: expected a finite number, got inf"),
    ("weight_decay", math.inf, "weight_decay: expected a finite number, got inf"),
    ("momentum", 1.5, "momentum: expected a number in [0.0, 1.0], got 1.5"),
    ("batch_size", 0, "batch_size: expected an integer in [1, inf], got 0"),
    ("max_seconds", math.nan, "max_seconds: expected a finite number, got nan"),
])
def test_every_minibatch_setting_is_checked_like_a_file_field(field, value, needle):
    from exhume.victim import MiniBatchConfig

    with pytest.raises(ConfigError) as err:
        MiniBatchConfig(**{field: value})
    assert str(err.value) == needle


@pytest.mark.parametrize("flag, value, needle", [
    ("--lr", "inf", "lr: expected a finite number, got inf"),
    ("--wd", "inf", "weight_decay: expected a finite number, got inf"),
    ("--seconds", "nan", "max_seconds: expected a finite number, got nan"),
    ("-n", "0", "n must be a positive integer, got 0"),
])
def test_exhume_train_refuses_a_setting_in_one_line(tmp_path, capsys, flag, value, needle):
    from exhume.cli import main

    assert main(["train", "--arch", "mlp:8", "-n", "10", "--no-progress", "-o", str(tmp_path / "v"), flag, value]) == 2
    err = capsys.readouterr().err
    assert err == f"exhume train: error: {needle}\n" and not (tmp_path / "v").exists()
