"""kkt's layer-scaled ReLU surrogate (``surrogate='layer-scaled'``): α = c / median|z| of each candidate's own
pre-activations at each ReLU. Its α follows the layer's scale (the surrogate derivative is the same at z and k·z),
the one-node and composite paths, the jvp, the traced replay, per-candidate rows under vmap and the batched restarts
all give the general path's numbers, and the setting is validated."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exhume.attacks import get_attack, kkt, surrogate
from exhume.attacks.stationarity import (
    TracedResidual,
    per_candidate_gradients,
    stationarity_residual_and_objective,
    stationarity_residual_jvp,
    weighted_gradient,
)
from exhume.attacks.surrogate import LayerScaled, layer_alpha, soft_activations, soft_relu
from exhume.errors import ConfigError
from exhume.models.builders import build_model
from exhume.victim import AttackerView

C = 5.0


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny tensors run faster on one thread


def _slope(z: torch.Tensor, alpha) -> torch.Tensor:
    zr = z.clone().requires_grad_()
    return torch.autograd.grad(soft_relu(zr, alpha).sum(), zr)[0]


@pytest.mark.parametrize("one_node", [False, True])
def test_the_layer_scaled_alpha_follows_each_candidates_scale(one_node, monkeypatch):
    if one_node:
        monkeypatch.setattr(surrogate, "ONE_NODE_MIN_ELEMENTS", 0)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(4, 3, 5, 5, dtype=torch.float64, generator=gen)
    k = torch.tensor([1.0, 1e-3, 0.02, 50.0], dtype=torch.float64).reshape(-1, 1, 1, 1)  # one scale per candidate
    a = layer_alpha(z * k, C)
    med = (z * k).abs().reshape(4, -1).median(1).values
    assert a.shape == (4, 1, 1, 1) and torch.allclose(a.flatten(), C / med, rtol=1e-12)
    # the derivative sigmoid(α·z) at k·z is the one at z (each row its own k); a fixed α's is not
    assert torch.allclose(_slope(z * k, LayerScaled(C)), _slope(z, LayerScaled(C)), rtol=1e-10)
    assert not torch.allclose(_slope(z * k, C), _slope(z, C), rtol=1e-3)
    assert torch.equal(soft_relu(z, LayerScaled(C)), torch.relu(z))  # the value untouched
    assert torch.isfinite(_slope(torch.zeros(2, 6, dtype=torch.float64), LayerScaled(C))).all()  # an all-zero layer


def _cnn():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8, bias=False),
                          nn.ReLU(), nn.Linear(8, 1, bias=False), nn.Flatten(0)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(2)
    # candidates of very different scales: the statistic must be each one's own
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64, generator=gen) * torch.tensor([1e-3, 1e-2, 0.1, 1, 3, 0.05],
                                                                                  dtype=torch.float64).reshape(-1, 1, 1, 1)
    lam = torch.rand(6, dtype=torch.float64, generator=gen) + 0.1
    y = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64)
    return model, params, x, lam, y


def _value_and_grads(fn, model, params, x0, y, lam0, alpha):
    x, lam = x0.clone().requires_grad_(), lam0.clone().requires_grad_()
    value, _ = fn(model, params, x, y, lam, alpha)
    gx, gl = torch.autograd.grad(value, (x, lam))
    return value.detach(), gx, gl


@pytest.mark.parametrize("one_node", [False, True])
def test_every_fast_path_gives_the_general_paths_numbers(one_node, monkeypatch):
    if one_node:
        monkeypatch.setattr(surrogate, "ONE_NODE_MIN_ELEMENTS", 0)
    model, params, x, lam, y = _cnn()
    alpha = LayerScaled(C)
    ref = _value_and_grads(stationarity_residual_and_objective, model, params, x, y, lam, alpha)
    traced = TracedResidual()
    for fn in (stationarity_residual_jvp, traced):
        ours = _value_and_grads(fn, model, params, x, y, lam, alpha)
        for a, b in zip(ours, ref):
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-12 * float(b.abs().max()))
    assert traced.info["residual_traced"]
    # one candidate at a time (vmap: closed-form multipliers' rows) sums to the weighted gradient of all together
    rows = per_candidate_gradients(model, params, x, y, alpha=alpha)
    g = weighted_gradient(model, params, x, y, lam, alpha)
    assert torch.allclose(rows.T @ lam, torch.cat([g[k].reshape(-1) for k in params]), rtol=1e-10, atol=1e-14)
    # and it is not the fixed surrogate: these candidates' scales differ by 3000×
    fixed = _value_and_grads(stationarity_residual_and_objective, model, params, x, y, lam, C)
    assert not torch.allclose(fixed[1], ref[1], rtol=1e-3)


def test_the_mode_scales_leaky_relus_too():
    z = torch.randn(3, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 1e-3
    zr = z.clone().requires_grad_()
    with soft_activations(LayerScaled(C)):
        out = torch.nn.functional.leaky_relu(zr, 0.1)
    (g,) = torch.autograd.grad(out.sum(), zr)
    assert torch.allclose(g, 0.1 + 0.9 * torch.sigmoid(layer_alpha(z, C) * z), rtol=1e-12)


def _view():
    torch.manual_seed(0)
    model = build_model("cnn:4;fc=16;pool=avg", (1, 12, 12), 1)
    return AttackerView(model=model, task="binary", input_shape=(1, 12, 12), mean=torch.full((1, 12, 12), 0.2),
                        loss="logistic", weight_decay=5e-3, n_train_hint=6)


def test_kkt_with_the_layer_scaled_surrogate_traced_equals_eager_and_lowers_the_residual(monkeypatch):
    monkeypatch.setattr(kkt, "traces", lambda iterations, seconds: True)
    view = _view()
    runs = {t: get_attack("kkt", iterations=30, dtype="float64", log_every=5, snapshot_every=10, surrogate="layer-scaled",
                          alpha=C, trace=t).run(view, progress=False) for t in ("auto", "off")}
    assert runs["auto"].config["residual_traced"] and runs["auto"].config["surrogate"] == "layer-scaled"
    assert torch.allclose(runs["auto"].candidates, runs["off"].candidates, rtol=0, atol=1e-9)
    hist = [h["stationarity"] for h in runs["off"].loss_history]
    assert hist[-1] < hist[0]
    fixed = get_attack("kkt", iterations=30, dtype="float64", snapshot_every=10, alpha=C, trace="off").run(view, progress=False)
    assert not torch.allclose(fixed.candidates, runs["off"].candidates, rtol=0, atol=1e-6)  # the option changes the descent


def test_kkt_layer_scaled_batched_restarts_equal_their_runs_one_by_one(monkeypatch):
    from exhume.portfolio import run_portfolio

    monkeypatch.setattr(kkt, "traces", lambda iterations, seconds: False)
    kw = dict(restarts=2, workers=1, progress=False, iterations=15, dtype="float64", surrogate="layer-scaled", alpha=C)
    one, batched = (run_portfolio(_view(), batch_restarts=b, **kw) for b in ("off", "on"))
    assert batched.config["portfolio"]["batched"]["groups"][0]["batched"]
    assert torch.allclose(one.candidates, batched.candidates, atol=1e-8)


@pytest.mark.parametrize("bad", ["layer", "relative", 3, None])
def test_an_unknown_surrogate_is_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match="surrogate") as err:
        get_attack("kkt", surrogate=bad)
    assert "\n" not in str(err.value) and "layer-scaled" in str(err.value)
