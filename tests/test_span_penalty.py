"""kkt's known-start span penalty one layer up: taken where what training added to the layer above a CNN's convolutions
shows the span (and only there), validated, taken alike by lone and batched restarts, and pulling the candidates'
features toward that span."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.kkt.settings import SPAN_PENALTY
from exhume.data import load_dataset
from exhume.data.tasks import select_task
from exhume.equations.span import delta_of, span_of
from exhume.errors import ConfigError
from exhume.models import build_model
from exhume.models.tap import features_of
from exhume.victim import AttackerView
from exhume.victim.start import TrainingSettings, check_start

N = 8
SGD = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "steps": 150}


def _victim(optimizer: str = "sgd"):
    """A CNN on 8 digits (8×8) whose head is trained from PyTorch's initialisation by 150 full-batch steps on the frozen
    convolution's features (the frozen-extractor regime): what training added to head.0 has rank ≤ 8, its weights do not."""
    task = select_task(load_dataset("digits"), "odd-even", N, seed=0)
    x, mean, y = task.centred.float(), task.mean.float(), task.y.float()
    torch.manual_seed(0)
    model = build_model("cnn:8;fc=32;pool=avg", (1, 8, 8), 1)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    head = list(model.head.parameters())
    opt = (torch.optim.SGD(head, lr=SGD["lr"], momentum=SGD["momentum"], weight_decay=SGD["weight_decay"]) if optimizer == "sgd"
           else torch.optim.Adam(head, lr=1e-2, weight_decay=SGD["weight_decay"]))
    for _ in range(SGD["steps"]):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x).squeeze(-1)).mean().backward()
        opt.step()
    return model.eval(), start, x, mean


def _view(model, mean, start=None, training=None):
    return AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=mean, loss="logistic", weight_decay=5e-4,
                        n_train_hint=N, start=None if start is None else check_start(start, model),
                        training=None if training is None else TrainingSettings(**training))


def test_the_penalty_is_taken_where_what_training_added_shows_the_span_and_nowhere_else():
    model, start, _, mean = _victim()
    w = model.head[0].weight
    assert not span_of(w, N).shows and span_of(delta_of(w, start["head.0.weight"], None)[0], N).shows  # the premise
    found = get_attack("kkt").stage_on(_view(model, mean, start, SGD))
    assert found is not None and found.added and found.above.layer == "head.0" and 0 < found.span.basis.shape[1] <= N
    run = get_attack("kkt", iterations=2).run(_view(model, mean, start, SGD), progress=False)
    assert run.config["span_penalty_used"] == SPAN_PENALTY and run.config["span_penalty_layer"] == "head.0"
    assert run.config["span_penalty_start_decay"] == pytest.approx(TrainingSettings(**SGD).decay(N))
    # no start: the weights alone show no span one layer up, so neither the stage nor the penalty
    assert get_attack("kkt").stage_on(_view(model, mean)) is None
    # a start that is not this model's (what "training added" is then full rank), or an Adam-trained head: no span
    other = {k: torch.randn_like(v) * v.std() for k, v in start.items()}
    other.update({k: v for k, v in start.items() if k.startswith("features")})
    assert get_attack("kkt").stage_on(_view(model, mean, other, SGD)) is None
    adam, adam_start, _, _ = _victim("adam")
    assert not span_of(delta_of(adam.head[0].weight, adam_start["head.0.weight"], None)[0], N).shows
    unused = get_attack("kkt", iterations=2).run(_view(adam, mean, adam_start, {"optimizer": "adam", "lr": 1e-2, "steps": 150}),
                                                 progress=False)
    assert unused.config["span_penalty_used"] == 0.0 and "shows the span" in unused.config["span_penalty_reason"]
    off = get_attack("kkt", span_penalty=0, iterations=2).run(_view(model, mean, start, SGD), progress=False)
    assert off.config["span_penalty_used"] == 0.0 and get_attack("kkt", span_penalty=0).stage_on(_view(model, mean, start, SGD)) is None


def test_span_penalty_is_validated():
    model, start, _, mean = _victim()
    for bad in (-1.0, "lots"):
        with pytest.raises(ConfigError, match="span_penalty"):
            get_attack("kkt", span_penalty=bad)
    with pytest.raises(ConfigError, match="span_penalty.*starting weights"):
        get_attack("kkt", span_penalty=2.0, iterations=2).run(_view(model, mean), progress=False)
    get_attack("kkt", span_penalty="auto", iterations=1).run(_view(model, mean), progress=False)  # 'auto' without a start: fine


def test_batched_and_lone_restarts_take_the_penalty_alike(tmp_path):
    """The batched path asks the lone run's predicate (KKTAttack.stage_on): restarts handed to it run one by one, each
    with the penalty, bit for bit what lone runs of the same seeds and settings return."""
    from _batched_lone import batched_and_lone

    model, start, _, mean = _victim()
    records, pairs = batched_and_lone(_view(model, mean, start, SGD), 15, tmp_path)
    assert records[0]["batched"] is False and "span penalty" in records[0]["reason"]
    for batched, lone in pairs:
        assert batched.config["span_penalty_used"] == lone.config["span_penalty_used"] == SPAN_PENALTY
        assert torch.equal(batched.candidates, lone.candidates)


def test_the_penalty_pulls_the_candidates_features_toward_what_training_added():
    """Same seed and iterations, with and without the penalty: the candidates' features at head.0 lie measurably
    closer to the row space of what training added (a penalty on another space, or none, would not move them so)."""
    model, start, _, mean = _victim()
    view = _view(model, mean, start, SGD)
    found = get_attack("kkt").stage_on(view)
    basis = found.span.basis.double()

    def distance(recon) -> float:
        with torch.no_grad():
            f = features_of(copy.deepcopy(model), "head.0", recon.candidates - mean).double()
        return float(((f - f @ basis @ basis.T).norm(dim=1) / f.norm(dim=1)).median())

    plain = distance(get_attack("kkt", span_penalty=0, iterations=600).run(view, progress=False))
    pulled = distance(get_attack("kkt", span_penalty=10.0, iterations=600).run(view, progress=False))
    assert pulled < 0.5 * plain, (pulled, plain)
