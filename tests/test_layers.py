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
    assert before["span_layer"] is None and "no weight layer shows" in before["finding"]
    assert "direction" in before["layers"][0]["why"] and "input_distance_median" not in before["layers"][0]  # 4 filters
    assert before["layers"][1]["input_distance_median"] > 0.5  # random weights: the features lie far outside
    with torch.no_grad():  # a stationary point's form: the fully connected layer is Σ_i d_i φ_iᵀ over the training features
        phi = model.features(x).flatten(1)
        model.head[0].weight.copy_(torch.randn(32, n) @ phi)
    after = layer_diagnostics(model, x)
    assert after["span_layer"] == "head.0.weight" and after["layers"][1]["rank_999"] <= n
    assert after["layers"][1]["input_distance_median"] < 1e-6
    assert after["finding"].startswith("Weights only: the weights show the training inputs' span at head.0.weight (a layer above "
                                       "the first)")
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


def _head_trained_from(optimizer: str, steps: int, lr: float, wd: float = 0.0, n: int = 6):
    """A tiny CNN whose fully connected layers are trained from a known start over frozen convolutions (a plain PyTorch
    loop, as one fine-tunes a head): what training added to ``head.0`` is ``Σ_t Σ_i δ_i(t) φ_iᵀ``, rank ≤ n, while its
    weights keep the start's noise."""
    torch.manual_seed(0)
    x, y = torch.randn(n, 1, 8, 8), torch.tensor([1.0, -1.0] * (n // 2))
    model = build_model("cnn:4;fc=32;pool=avg", (1, 8, 8), 1)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    model.features.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.SGD(params, lr=lr, weight_decay=wd) if optimizer == "sgd" else torch.optim.Adam(params, lr=lr))
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x).reshape(-1)).mean().backward()
        opt.step()
    return model.requires_grad_(True), start, x


def test_with_the_start_known_what_training_added_shows_the_span_where_the_weights_do_not():
    model, start, x = _head_trained_from("sgd", 30, 0.1)
    report = layer_diagnostics(model, x, start=start)
    head = report["layers"][1]
    assert report["span_layer"] is None and not head["shows_span"]  # the start's noise hides it in the weights
    assert report["delta_span_layer"] == "head.0.weight" and head["delta"]["shows_span"] and head["delta"]["rank_999"] <= 6
    assert head["delta"]["decay"] == pytest.approx(1.0, abs=1e-6)  # no weight decay: the fitted c keeps the whole start
    assert "it equals its start" in report["layers"][0]["delta"]["why"]  # the frozen convolution
    assert report["finding"].startswith("With the start known, what training added to head.0.weight (a layer above the first;")
    assert "Weights only: no weight layer shows" in report["finding"]
    assert head["delta"]["input_distance_median"] < 1e-4 < 0.5 < head["input_distance_median"]  # EVALUATOR, both row spaces
    assert "Δ σ7/σ1" in layers_text(report).splitlines()[0]
    assert "delta" not in layer_diagnostics(model, x)["layers"][1]  # weights only: no Δ


def test_what_training_added_is_taken_net_of_the_starts_share_left_by_weight_decay():
    lr, wd, steps = 0.1, 0.5, 30
    model, start, x = _head_trained_from("sgd", steps, lr, wd)
    c = (1 - lr * wd) ** steps  # full-batch SGD's coupled decay: θ_T = c·θ_0 + (what the gradients added)
    given = layer_spectra(model, 6, start, decay=c)["layers"][1]["delta"]
    assert given["shows_span"] and given["sigma_after_n"] < 1e-5 and given["decay_rule"] == "from the training settings"
    fitted = layer_spectra(model, 6, start)["layers"][1]["delta"]
    assert fitted["decay"] == pytest.approx(c, rel=1e-3) and fitted["shows_span"]
    assert not layer_spectra(model, 6, start, decay=1.0)["layers"][1]["delta"]["shows_span"]  # W − W_start keeps (c − 1)·W_start


def test_a_full_rank_update_shows_no_span_and_the_finding_says_neither():
    model, start, x = _head_trained_from("adam", 30, 1e-2)  # Adam's per-weight steps spread over every direction
    report = layer_diagnostics(model, x, start=start)
    assert report["span_layer"] is None and report["delta_span_layer"] is None
    assert report["layers"][1]["delta"]["sigma_after_n"] > 1e-2
    assert report["finding"].startswith("With the start known, neither what training added nor the weights show the training "
                                        "inputs' span at any layer: at the closest, what training added to head.0.weight")


def test_exhume_train_reports_what_training_added_against_the_start_it_trained_from(tmp_path, capsys):
    import json

    from exhume.cli import main

    lr, wd, n = 0.1, 0.05, 8
    out = tmp_path / "v"
    assert main(["train", "-o", str(out), "--data", "digits", "-n", str(n), "--arch", "mlp:16;bias=none", "--lr", str(lr), "--wd",
                 str(wd), "--batch-size", "7", "--momentum", "0.5", "--epochs", "12", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    layers = json.loads((out / "victim.json").read_text())["metrics"]["layers"]
    first = layers["layers"][0]["delta"]
    # 8 images in batches of 7: one step an epoch (the lone eighth is skipped), so c is 12 steps of SGD with momentum
    step = torch.tensor([[0.5, wd], [-lr * 0.5, 1 - lr * wd]], dtype=torch.float64)
    c = float((torch.linalg.matrix_power(step, 12) @ torch.tensor([0.0, 1.0], dtype=torch.float64))[1])
    assert first["decay"] == pytest.approx(c, rel=1e-9) and first["decay_rule"] == "from the training settings"
    assert first["shows_span"] and first["sigma_after_n"] < 1e-4  # the first layer's Δ lies in the inputs' span: c was right
    assert layers["delta_span_layer"] == layers["layers"][0]["name"] and "With the start known" in printed
    assert not (out / "start.safetensors").exists()  # known to train, not kept without --keep-start


def test_the_fitted_share_of_a_convolutions_start_reads_it_as_out_by_in_k_k():
    from exhume.equations.span import delta_of

    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(16, 3, 3, 3, generator=gen, dtype=torch.float64)
    added = torch.outer(torch.randn(16, generator=gen, dtype=torch.float64), torch.randn(27, generator=gen, dtype=torch.float64))
    delta, c = delta_of(0.7 * w0 + 0.3 * added.reshape(16, 3, 3, 3), w0)
    assert c == pytest.approx(0.7, abs=1e-6) and delta.shape == w0.shape
    assert torch.linalg.svdvals(delta.reshape(16, -1))[1] < 1e-5  # the rank-one part training added, and nothing of the start
