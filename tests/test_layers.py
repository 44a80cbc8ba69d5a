"""Where the weights show the training inputs' span: the spectra (weights only) and the evaluator's per-layer numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exhume.equations.span import layer_spectra
from exhume.evaluation.layers import layer_diagnostics, layers_text
from exhume.models import build_model


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float = 0.2, wd: float = 5e-3) -> nn.Module:
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    for _ in range(epochs):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x)).mean().backward()
        opt.step()
    return model


def test_a_small_init_mlp_shows_the_span_at_its_first_layer():
    torch.manual_seed(0)
    n, x = 6, torch.randn(6, 1, 5, 5)
    y = torch.tensor([1.0, -1.0] * 3)
    model = _fit(build_model("mlp:32,16;bias=none;init=1e-4", (1, 5, 5), 1), x, y, 400)
    spectra = layer_spectra(model, n)
    first = spectra["layers"][0]
    assert spectra["span_layer"] == first["name"] and first["shows_span"] and first["rank_999"] <= n
    assert first["sigma_after_n"] < 1e-2  # the small initialisation is all that lies outside the data's span
    assert spectra["layers"][-1]["why"].startswith("it sees 1 direction,")
    report = layer_diagnostics(model, x)
    assert report["layers"][0]["input_distance_median"] < 1e-2  # the training inputs lie in its top-n row space (up to the init)
    assert "(the first weight layer)" in report["finding"] and "EVALUATOR" in report["finding"]


def test_a_cnn_shows_the_span_one_layer_up_only_where_its_weights_hold_the_features():
    torch.manual_seed(0)
    n, x = 5, torch.randn(5, 1, 8, 8)
    model = build_model("cnn:4;fc=32;pool=avg", (1, 8, 8), 1)
    before = layer_diagnostics(model, x)
    assert before["span_layer"] is None and "No weight layer shows" in before["finding"]
    assert "direction" in before["layers"][0]["why"] and "input_distance_median" not in before["layers"][0]  # 4 filters
    assert before["layers"][1]["input_distance_median"] > 0.5  # random weights: the features lie far outside
    with torch.no_grad():  # a stationary point's form: the fully connected layer is Σ_i d_i φ_iᵀ over the training features
        phi = model.features(x).flatten(1)
        model.head[0].weight.copy_(torch.randn(32, n) @ phi)
    after = layer_diagnostics(model, x)
    assert after["span_layer"] == "head.0.weight" and after["layers"][1]["rank_999"] <= n
    assert after["layers"][1]["input_distance_median"] < 1e-6
    assert "(a layer above the first)" in after["finding"]
    text = layers_text(after)
    assert "head.0.weight" in text and after["finding"] in text


def test_near_zero_preactivations_are_counted_at_the_training_inputs():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 1, bias=False))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].weight[0, 0] = 1.0  # unit 0 sees x_0, units 1 and 2 output exactly 0
    x = torch.tensor([[[0.5, 1.0, 1.0, 1.0]], [[0.005, 1.0, 1.0, 1.0]]])
    row = layer_diagnostics(model, x)["layers"][0]
    assert row["preactivations_within_0.01"] == pytest.approx(5 / 6) and row["preactivations_within_0.001"] == pytest.approx(4 / 6)


def test_n_must_be_positive():
    with pytest.raises(ValueError, match="positive number of training points"):
        layer_spectra(nn.Linear(3, 2), 0)


def test_training_stops_once_the_layer_above_the_convolutions_shows_the_span():
    from exhume.victim import TrainConfig, make_victim

    cfg = TrainConfig(loss="logistic", lr=0.5, weight_decay=5e-2, max_epochs=3000, span_threshold=1e-5, log_every=50)
    victim = make_victim("digits", "odd-even", 8, "cnn:8;fc=64;pool=avg", cfg, seed=0, progress=False, test_size=0)
    assert victim.metrics["stop_reason"] == "span_threshold" and victim.metrics["epochs"] < 3000
    report = layer_diagnostics(victim.model, victim.train_set.centred.float())
    assert report["span_layer"] == "head.0.weight" and report["layers"][1]["input_distance_median"] < 0.02
