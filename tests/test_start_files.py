"""The known start's files and settings: the loader's one-line refusals, frozen parameters, and the training
settings' decay (the equation and the attack: test_start.py)."""

from __future__ import annotations

import pytest
import torch
from _start_cases import Tiny, state
from safetensors.torch import save_file
from torch import nn

from exhume.equations.trajectory import build_equation
from exhume.errors import ConfigError, VictimError
from exhume.victim import AttackerView
from exhume.victim.start import TrainingSettings, check_start, frozen_names, load_start, training_settings
from exhume.victim.wrap import Audited


# -- the loader ----------------------------------------------------------------------------------
def test_a_start_file_of_this_model_is_read_as_its_parameters(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    save_file(state(model), str(tmp_path / "s.safetensors"))
    torch.save(state(model), tmp_path / "s.pt")
    for f in ("s.safetensors", "s.pt"):
        start = load_start(tmp_path / f, model)
        assert sorted(start) == sorted(k for k, _ in model.named_parameters())
        assert all(torch.equal(start[k], v) for k, v in model.named_parameters())


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_start_for_another_model_is_refused_in_one_line(tmp_path):
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    save_file(state(other), str(tmp_path / "o.safetensors"))
    with pytest.raises(VictimError) as e:
        load_start(tmp_path / "o.safetensors", Tiny())
    assert "another model" in _one_line(e) and "'0.bias'" in str(e.value)


def test_a_start_missing_a_parameter_is_refused_naming_it_unless_partial():
    model = Tiny()
    s = state(model)
    del s["b.weight"]
    with pytest.raises(VictimError) as e:
        check_start(s, model)
    assert "'b.weight'" in _one_line(e) and "partial" in str(e.value)
    assert sorted(check_start(s, model, partial=True)) == ["a.bias", "a.weight", "b.bias"]


def test_a_start_with_an_extra_key_is_refused_naming_it():
    model = Tiny()
    with pytest.raises(VictimError) as e:
        check_start({**state(model), "c.weight": torch.zeros(2)}, model)
    assert "'c.weight'" in _one_line(e)


def test_a_start_of_another_shape_is_refused_naming_the_parameter_and_the_expected_shape():
    model = Tiny()
    with pytest.raises(VictimError) as e:
        check_start({**state(model), "a.weight": torch.zeros(8, 5)}, model)
    assert "a.weight" in _one_line(e) and "(8, 5)" in str(e.value) and "(8, 6)" in str(e.value)


def test_a_start_with_nan_is_refused_naming_the_parameter():
    model = Tiny()
    bad = state(model)
    bad["a.bias"][3] = float("nan")
    with pytest.raises(VictimError) as e:
        check_start(bad, model)
    assert "a.bias" in _one_line(e) and "NaN" in str(e.value)


def test_a_pickled_module_is_never_unpickled(tmp_path):
    torch.save(Tiny(), tmp_path / "m.pt")
    with pytest.raises(VictimError) as e:
        load_start(tmp_path / "m.pt", Tiny())
    assert "never unpickles" in _one_line(e)


def test_a_truncated_start_file_is_refused(tmp_path):
    save_file(state(Tiny()), str(tmp_path / "s.safetensors"))
    (tmp_path / "t.safetensors").write_bytes((tmp_path / "s.safetensors").read_bytes()[:40])
    with pytest.raises(VictimError) as e:
        load_start(tmp_path / "t.safetensors", Tiny())
    assert "t.safetensors" in _one_line(e)


def test_buffers_are_accepted_and_a_wrapper_s_prefix_is_added():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    start = check_start(state(model), Audited(model, torch.ones(()), "logit"))
    assert sorted(start) == ["model.0.bias", "model.0.weight", "model.1.bias", "model.1.weight", "model.2.bias", "model.2.weight"]


# -- frozen parameters and the view --------------------------------------------------------------
def test_parameters_equal_to_their_start_are_frozen_and_left_out_of_the_equation():
    torch.manual_seed(0)
    model = Tiny()
    start = state(model)
    with torch.no_grad():
        model.b.weight.add_(0.1)
        model.b.bias.add_(0.1)
    assert frozen_names(model, check_start(start, model)) == ["a.weight", "a.bias"]
    view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=start)
    params = {k: v.detach() for k, v in model.named_parameters()}
    eq = build_equation(view, model, params, "trajectory", 10)
    assert eq.names == ("b.weight", "b.bias") and eq.info["frozen_parameters"] == ["a.bias", "a.weight"]


def test_a_start_equal_to_every_trained_weight_is_refused():
    model = Tiny()
    with pytest.raises(VictimError, match="nothing was trained"):
        AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=state(model))


# -- training settings ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"optimizer": "rmsprop"}, "optimizer"), ({"lr": 0.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"momentum": 1.0}, "momentum"),
    ({"betas": (0.9,)}, "betas"), ({"betas": (0.9, 1.0)}, r"betas\[1\]"), ({"weight_decay": -1e-4}, "weight_decay"),
    ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"epochs": 0}, "epochs"), ({"batch_size": True}, "batch_size"),
    ({"eps": -1.0}, "eps"), ({"second_moment": {"a.weight": -torch.ones(2)}}, "second_moment"),
])
def test_bad_training_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainingSettings(**kwargs)


def test_unknown_training_setting_is_refused():
    with pytest.raises(ConfigError, match="unknown training setting.*dampening"):
        training_settings({"dampening": True})


@pytest.mark.parametrize("opt, kwargs", [("sgd", {"momentum": 0.9}), ("sgd", {}), ("adamw", {})])
def test_the_decay_is_what_the_optimiser_does_to_the_start_without_data(opt, kwargs):
    """Zero data gradient: PyTorch's own optimiser shrinks θ_0 by exactly TrainingSettings.decay."""
    theta = nn.Parameter(torch.ones(3, dtype=torch.float64))
    lr, wd, steps = 0.05, 3e-2, 37
    optim = (torch.optim.SGD([theta], lr=lr, weight_decay=wd, **kwargs) if opt == "sgd"
             else torch.optim.AdamW([theta], lr=lr, weight_decay=wd))
    for _ in range(steps):
        optim.zero_grad()
        theta.grad = torch.zeros_like(theta)
        optim.step()
    c = TrainingSettings(optimizer=opt, lr=lr, weight_decay=wd, steps=steps, **kwargs).decay(None)
    assert abs(float(theta.detach()[0]) - c) < 1e-12
    assert TrainingSettings(optimizer="sgd", lr=lr, weight_decay=wd, epochs=3, batch_size=4).total_steps(10) == 9
