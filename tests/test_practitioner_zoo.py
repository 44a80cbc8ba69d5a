"""The practitioner zoo (benchmarks/practitioner/): a tiny victim built by its own functions, and explain.py's fit."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from practitioner import build, explain  # noqa: E402


def tiny_frozen_head_adam() -> build.Spec:
    """The zoo's frozen-feature-extractor victim, shrunk (20 images, 2 epochs, a 64-image pre-training), trained with Adam."""
    return replace(build.BY_NAME["mnist-frozen-head"], name="tiny", optimizer="adam", lr=1e-3, n=20, unseen=30, epochs=2,
                   batch=8, pretrain=replace(build._MNIST_PRE, n=64, epochs=1))


def test_tiny_victim_files_complete_and_consistent(tmp_path):
    from safetensors.torch import load_file

    from exhume.audit import load_images, load_model_class, load_weights
    from exhume.audit.command import KEYS, settings

    spec = tiny_frozen_head_adam()
    info = build.build_victim(spec, tmp_path)
    folder = tmp_path / "tiny"
    assert build.complete(folder, spec) and (folder / "optimizer_state.safetensors").is_file()
    assert info["steps"] == spec.epochs * math.ceil(spec.n / spec.batch)
    end, start = load_file(str(folder / "weights.safetensors")), load_file(str(folder / "start.safetensors"))
    assert sorted(end) == sorted(start)
    assert sorted(info["frozen"]) == [k for k in end if k.startswith("trunk.")] and info["frozen"]
    for k in end:  # frozen parameters equal their start, trained ones moved
        assert torch.equal(end[k], start[k]) == k.startswith("trunk."), k
    assert sorted(load_file(str(folder / "optimizer_state.safetensors"))) == sorted(k for k in end if k.startswith("head."))
    pre = json.loads((folder / "pretrain.json").read_text())
    split = info["split"]
    for a, b in ((pre["indices"], split["train_indices"]), (pre["indices"], split["unseen_indices"]),
                 (split["train_indices"], split["unseen_indices"])):
        assert not set(a) & set(b)
    cfg = settings(__import__("argparse").Namespace(config=str(folder / "audit.toml"), param=[], **{k: None for k in KEYS}))
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    assert len(x) == spec.n and len(load_images(cfg.unseen, need_labels=False)[0]) == 30
    with torch.no_grad():
        pred = (model((torch.from_numpy(x) - 0.1307) / 0.3081).squeeze(1) > 0).long().numpy()
    assert float((pred == y).mean()) == info["train_accuracy"]
    assert cfg.loss == "logistic" and cfg.weight_decay == spec.weight_decay and cfg.normalize == "0.1307,0.3081"
    build.build_victim(spec, tmp_path / "again")  # seeded: the same weights byte for byte
    assert (folder / "weights.safetensors").read_bytes() == (tmp_path / "again" / "tiny" / "weights.safetensors").read_bytes()


def test_explain_fit_exact_for_linear_model_trained_from_known_start():
    """Full-batch GD with weight decay on a linear model: θ − θ_start = (a − 1)·θ_start + Σ_i c_i ∇margin_i exactly."""
    from exhume.data import load_sklearn_digits
    from exhume.victim.wrap import Audited

    ds = load_sklearn_digits()
    x = torch.from_numpy(ds.images[:20]).double()
    y = torch.from_numpy(np.where(ds.labels[:20] % 2 == 1, 1.0, -1.0))
    torch.manual_seed(0)
    start = Audited(build.models.MLP(64, [], 1), torch.tensor(1.0)).double()
    end = Audited(build.models.MLP(64, [], 1), torch.tensor(1.0)).double()
    end.load_state_dict(start.state_dict())
    opt = torch.optim.SGD(end.parameters(), lr=0.5, weight_decay=1e-2)
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.softplus(-y[:10] * end(x[:10])).mean().backward()
        opt.step()
    res = explain.explain_models(end, start, (x[:10], y[:10]), (x[10:], y[10:]), "logistic", objectives=("margin",))
    assert res["trained_parameters"] == 65
    assert res["margin"]["train"]["ii"] < 1e-8 and res["margin"]["train"]["iii"] < 1e-8
    assert res["margin"]["unseen"]["ii"] > 0.1  # other images do not span what training added
    expected = explain.decay_coefficient({"optimizer": {"name": "sgd", "lr": 0.5, "weight_decay": 1e-2}, "steps": 40})
    assert abs(expected - ((1 - 0.5 * 1e-2) ** 40 - 1)) < 1e-12
    assert abs(res["margin"]["train"]["start_coefficient"] - expected) < 1e-6


def test_the_head_of_a_frozen_extractor_is_the_model_with_its_features_given(tmp_path):
    """oracle_features.py's head view: the extractor found, the model's output reproduced from the features, the
    known-start equation's residual at the true features equal to the audit's at the images, and the inversion
    moving the mean image's features towards a training image's."""
    from practitioner import oracle_features as of

    from exhume.evaluation.residuals import known_start_residual

    build.build_victim(tiny_frozen_head_adam(), tmp_path)
    data, x, y, unseen = of.audited(tmp_path / "tiny")
    view = data.view
    ext = of.find_extractor(view.model, view.start)
    assert ext is not None and ext.endswith("trunk.0")
    head = of.head_view(view, ext)
    feats = of.features(view.model, ext, data.centred)
    with torch.no_grad():
        assert torch.allclose(head.model(feats - head.mean), view.model(data.centred), atol=1e-5)
    in_images = known_start_residual(view, data.centred, data.y)["value"]
    in_features = known_start_residual(head, (feats - head.mean).detach(), data.y)["value"]
    assert in_images == pytest.approx(in_features, rel=1e-6)
    target = feats[:2].detach()
    _, err0 = of.invert(view.model, ext, target, view.mean, 1)  # the error before the first step
    _, err = of.invert(view.model, ext, target, view.mean, 200)
    assert err < 0.5 * err0
