"""kkt's span one layer up: the network above a layer, the layer whose weights show the span, the inversion, the run."""

from __future__ import annotations

import torch
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.kkt.stage import Above, invert, layer_above
from exhume.data import load_dataset
from exhume.data.tasks import select_task
from exhume.models import build_model
from exhume.models.tap import features_of
from exhume.victim import AttackerView


def _digits(n: int):
    task = select_task(load_dataset("digits"), "odd-even", n, seed=0)
    return task.x.float(), task.centred.float(), task.mean.float(), task.y.float()


def _planted(n: int = 6):
    """A CNN on 8×8 digits whose fully connected layer is Σ_i d_i φ_iᵀ over n images' features (a stationary point's form)."""
    _, x, mean, _ = _digits(n)
    torch.manual_seed(0)
    model = build_model("cnn:8;fc=32;pool=avg", (1, 8, 8), 1)
    with torch.no_grad():
        phi = features_of(model, "head.0", x)
        model.head[0].weight.copy_(torch.randn(32, n) @ phi / phi.norm(dim=1).mean())
    return model, x, mean


def test_above_is_the_network_from_that_layer_on_with_only_its_parameters():
    model, x, _ = _planted()
    feats = features_of(model, "head.0", x)
    above = Above(model, "head.0", (1, 8, 8), scale=2.0)
    assert [k for k, _ in above.named_parameters()] == ["net.head.0.weight", "net.head.2.weight"]
    assert torch.allclose(above(feats / 2.0), model(x), atol=1e-6)


class _Skip(nn.Module):
    """The input reaches the output around the fully connected layer as well: no cut there."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.side = inner, nn.Linear(64, 1, bias=False)

    def forward(self, x):
        return self.inner(x) + self.side(x.flatten(1)).squeeze(-1)


def test_the_layer_above_is_found_where_its_weights_hold_the_features_only():
    model, _, mean = _planted()
    found = layer_above(model, (1, 8, 8), mean, 6)
    assert found is not None and found[0].layer == "head.0" and 0 < found[1].basis.shape[1] <= 6
    assert layer_above(build_model("cnn:8;fc=32;pool=avg", (1, 8, 8), 1), (1, 8, 8), mean, 6) is None  # random weights
    assert layer_above(_Skip(model), (1, 8, 8), mean, 6) is None


def test_features_invert_to_the_images_they_came_from():
    raw, x, mean, _ = _digits(4)
    torch.manual_seed(0)
    model = build_model("cnn:8;pool=avg", (1, 8, 8), 1)  # 128 features of 64 pixels, read at the output layer
    with torch.no_grad():
        target = features_of(model, "head.0", x)
    images, info = invert(model, "head.0", target, mean, seed=0)
    a, b = images.reshape(4, -1), raw.reshape(4, -1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    corr = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    assert corr.min() > 0.9 and info["inversion_feature_error_median"] < 0.05


def test_a_kkt_run_solves_in_feature_space_where_only_a_layer_above_shows_the_span():
    model, _, mean = _planted()
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic", weight_decay=5e-3,
                        n_train_hint=6)
    staged = get_attack("kkt", iterations=40).run(view, progress=False)
    cfg = staged.config
    assert cfg["subspace_used"] == "layer above" and cfg["subspace_layer"] == "net.head.0.weight" and cfg["subspace_rank"] <= 6
    assert staged.candidates.shape == (12, 1, 8, 8) and torch.isfinite(staged.candidates).all()
    assert cfg["feature_stage_iterations"] == 40 and cfg["inversion_steps"] > 0
    plain = get_attack("kkt", iterations=40, subspace="off").run(view, progress=False)
    assert "feature_stage_iterations" not in plain.config and plain.summary["iterations"] == 40


def test_a_staged_run_keeps_its_deadline_and_has_no_batched_path():
    """The stage takes its share of the deadline, the inversion the rest; the portfolio runs such restarts one per process."""
    import time

    from exhume.deadline import Deadline
    from exhume.portfolio.batched import use_batched

    model, _, mean = _planted()
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic", weight_decay=5e-3,
                        n_train_hint=6)
    t0 = time.perf_counter()
    staged = get_attack("kkt", iterations=10**7).run(view, progress=False, deadline=Deadline.after(3.0))
    took = time.perf_counter() - t0
    assert staged.config["subspace_used"] == "layer above" and 1 <= staged.config["inversion_steps"]
    assert 2.0 <= took < 3.0 + 10.0, took  # the loops stop at their deadlines (slack for a loaded machine's last steps)
    why = get_attack("kkt").unbatched_on(view)
    assert why is not None and "head.0" in why and not use_batched("auto", "cuda", "kkt", None, lambda: why)[0]
    assert get_attack("kkt", subspace="off").unbatched_on(view) is None
    flat = AttackerView(model=build_model("mlp:16", (1, 8, 8), 1), task="binary", input_shape=(1, 8, 8), mean=mean,
                        loss="logistic", weight_decay=5e-3, n_train_hint=6)
    assert get_attack("kkt").unbatched_on(flat) is None


def test_a_staged_run_resumes_its_stage_from_its_checkpoint(tmp_path, monkeypatch):
    """Cut at 30 iterations and resumed to 50 (20 more steps), the staged run returns what an uninterrupted
    50-iteration run does."""
    from exhume.attacks.kkt.step import Step

    steps: list[int] = []
    call = Step.__call__
    monkeypatch.setattr(Step, "__call__", lambda self, it, *a: (steps.append(it), call(self, it, *a))[1])
    model, _, mean = _planted()
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic", weight_decay=5e-3,
                        n_train_hint=6)
    get_attack("kkt", iterations=30).run(view, tmp_path / "cut", progress=False, checkpoint_every=10)
    assert (tmp_path / "cut" / "feature_stage" / "checkpoint.pt").is_file()
    steps.clear()
    resumed = get_attack("kkt", iterations=50).run(view, tmp_path / "cut", resume=True, progress=False, checkpoint_every=10)
    assert steps == list(range(31, 51))
    whole = get_attack("kkt", iterations=50).run(view, tmp_path / "whole", progress=False, checkpoint_every=10)
    assert resumed.config["feature_stage_iterations"] == 50 and torch.equal(resumed.candidates, whole.candidates)
    fresh = get_attack("kkt", iterations=50).run(view, tmp_path / "cut", progress=False)  # a new run drops the old checkpoint
    assert torch.equal(fresh.candidates, whole.candidates)


def test_batched_and_lone_restarts_of_a_staged_victim_take_the_stage_alike(tmp_path):
    """The batched path asks the lone run's predicate (KKTAttack.stage_on): restarts of a staged victim handed to it run
    one by one, each taking the stage, bit for bit what lone runs of the same seeds and settings return."""
    from _batched_lone import batched_and_lone

    model, _, mean = _planted()
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic", weight_decay=5e-3,
                        n_train_hint=6)
    records, pairs = batched_and_lone(view, 20, tmp_path)
    assert records[0]["batched"] is False and "head.0" in records[0]["reason"]
    for batched, lone in pairs:
        assert batched.config["subspace_used"] == lone.config["subspace_used"] == "layer above"
        assert torch.equal(batched.candidates, lone.candidates)


def _best_correlations(candidates: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    a, b = images.reshape(images.shape[0], -1), candidates.reshape(candidates.shape[0], -1).float()
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return ((a / a.norm(dim=1, keepdim=True)) @ (b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)).T).max(dim=1).values


def test_the_stage_recovers_digits_from_a_cnn_whose_span_shows_only_a_layer_up():
    """8 digits, a CNN whose fully connected head was trained to a stationary point on its (frozen, random) convolution's
    features: the span shows at head.0 (σ_9/σ_1 ≈ 1e-5), none at the first layer. Measured at 400 iterations: the stage's
    best candidates correlate 0.91, 0.85, 0.79, 0.77, 0.75 with five digits (the pixel-space attack, subspace="off",
    0.76 at best: a measurement, not asserted, so that a better pixel-space attack breaks nothing here)."""
    raw, x, mean, y = _digits(8)
    torch.manual_seed(0)
    model = build_model("cnn:8;fc=64;pool=avg", (1, 8, 8), 1)
    with torch.no_grad():
        feats = model.features(x).flatten(1)
    opt = torch.optim.SGD(model.head.parameters(), lr=0.5, weight_decay=5e-3)
    for _ in range(4000):
        opt.zero_grad()
        nn.functional.softplus(-y * model.head(feats).squeeze(-1)).mean().backward()
        opt.step()
    view = AttackerView(model=model.eval(), task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic",
                        weight_decay=5e-3, n_train_hint=8)
    staged = get_attack("kkt", iterations=400).run(view, progress=False)
    assert staged.config["subspace_used"] == "layer above"
    assert int((_best_correlations(staged.candidates, raw) >= 0.75).sum()) >= 4  # five measured
