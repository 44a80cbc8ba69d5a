"""The conventions the audit relies on: heads, normalisation, labels, verdicts, quiet progress, help."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import exhume
from exhume.attacks import PortfolioRecord, Reconstruction, RestartRecord, RunRecord
from exhume.audit import Audited
from exhume.audit.facade import _labels
from exhume.cli import build_parser, main
from exhume.evaluation.assumptions import unmodelled_layers
from exhume.evaluation.residuals import relative_stationarity
from exhume.evaluation.table import summary_rows
from exhume.evaluation.verdict import decide, fisher_p
from exhume.victim import AttackerView


def test_two_logit_cross_entropy_is_the_logistic_loss_of_the_margin():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    x, cls = torch.rand(6, 1, 4, 4), torch.tensor([0, 1, 1, 0, 1, 0])
    wrapped = Audited(net, torch.full((1, 4, 4), 0.5), "two-logit", positive=1)
    y, pos = _labels(cls.numpy(), "binary", 2, None)
    assert pos == 1 and y.tolist() == [-1, 1, 1, -1, 1, -1]
    ce = F.cross_entropy(net(x / 0.5), cls, reduction="none")
    assert torch.allclose(F.softplus(-y * wrapped(x)), ce, atol=1e-6)
    # the stationarity residual of the wrapped model under the logistic loss = that of the CE model
    r_wrapped = relative_stationarity(wrapped, x, y, "logistic", 1e-2)["value"]
    r_plain = relative_stationarity(Audited(net, torch.full((1, 4, 4), 0.5), "logits"), x, cls, "cross-entropy", 1e-2)["value"]
    assert r_wrapped == pytest.approx(r_plain, rel=1e-9)


def test_attacker_view_wraps_a_two_logit_binary_model():
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    view = AttackerView(model=net, task="binary", input_shape=(1, 2, 2), mean=0.5, loss="cross-entropy")
    x = torch.rand(3, 1, 2, 2)
    assert view.loss == "logistic" and torch.allclose(view.model(x), net(x)[:, 1] - net(x)[:, 0])
    recon = exhume.attack(view, "kkt", iterations=3, restarts=1, progress=False)  # was: IndexError in the margin
    assert recon.candidates.shape == (200, 1, 2, 2)


def test_one_logit_positive_class_and_bad_labels():
    y, pos = _labels(np.array([3, 7, 7]), "binary", 1, None)
    assert pos == 7 and y.tolist() == [-1, 1, 1]  # the larger label is +1, as BCE-with-logits
    y, pos = _labels(np.array([3, 7, 7]), "binary", 1, 3)
    assert y.tolist() == [1, -1, -1]
    with pytest.raises(exhume.ExhumeError, match="needs two"):
        _labels(np.array([0, 1, 2]), "binary", 1, None)


def test_scalar_and_per_channel_mean_are_broadcast():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 1))
    view = AttackerView(model=model, task="binary", input_shape=(3, 2, 2), mean=0.286)
    assert view.mean.shape == (3, 2, 2) and torch.all(view.mean == 0.286)
    view = AttackerView(model=model, task="binary", input_shape=(3, 2, 2), mean=[0.1, 0.2, 0.3])
    assert view.mean[:, 1, 1].tolist() == pytest.approx([0.1, 0.2, 0.3])
    with pytest.raises(exhume.ExhumeError, match="one per channel"):
        AttackerView(model=model, task="binary", input_shape=(3, 2, 2), mean=[0.1, 0.2])


def test_unmodelled_layers_are_found_in_modules_and_functional_calls():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    x = torch.rand(2, 4)
    assert unmodelled_layers(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)), x) == []
    assert "tanh" in unmodelled_layers(Functional(), x)[0]
    reasons = unmodelled_layers(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.GELU(), nn.Linear(4, 1)), x)
    assert any("BatchNorm1d" in r for r in reasons) and any("GELU" in r for r in reasons)


def test_verdict_has_three_values_and_a_reason():
    base = {"n_train": 50, "pool_size": 500, "control_size": 50, "memorised_control": 1}
    leak = decide({**base, "memorised": 12}, ["the network uses GELU"])
    assert leak.verdict == "leaks" and leak.p_value == pytest.approx(fisher_p(12, 50, 1, 50))  # evidence stands
    assert leak.p_value < 0.05
    unsure = decide({**base, "memorised": 2}, ["the network uses GELU"])
    assert unsure.verdict == "inconclusive" and "GELU" in unsure.reason
    clean = decide({**base, "memorised": 2}, [])
    assert clean.verdict == "no evidence" and "not proof" in clean.reason
    assert decide({**base, "memorised": 2, "memorised_control": None}, []).verdict == "inconclusive"
    # unseen images that cannot show a difference: "no evidence" becomes "inconclusive", a leak stays a leak
    for bad, needle in (({"pool_size": 99}, "pool holds only 99"), ({"control_size": 9, "memorised_control": 0}, "control holds only 9"),
                        ({"pool_exact_copies_of_train": 2, "control_exact_copies_of_train": 1}, "3 of the unseen images")):
        unsure = decide({**base, "memorised": 2, **bad}, [])
        assert unsure.verdict == "inconclusive" and needle in unsure.reason, unsure.reason
        assert decide({**base, "memorised": 40, **bad}, []).verdict == "leaks"
    assert decide({**base, "memorised": 2, "pool_size": 100, "control_size": 10, "memorised_control": 0}, []).verdict == "no evidence"


def test_public_evaluate_on_plain_arrays_with_a_verdict():
    rng = np.random.default_rng(0)
    train, unseen = rng.random((10, 8, 8)).astype(np.float32), rng.random((60, 8, 8)).astype(np.float32)
    recon = Reconstruction("kkt", torch.from_numpy(train[:, None]).clone(), torch.ones(10), None,
                           RunRecord(final_relative_stationarity=0.01), 0)
    m = exhume.evaluate(recon, train=(train, np.zeros(10)), unseen=unseen, figures=False).metrics
    assert m["memorised"] == 10 and m["memorised_control"] < 5 and m["control_size"] == 10 and m["pool_size"] == 50
    assert m["verdict"] == "leaks" and m["p_value"] == pytest.approx(fisher_p(10, 10, m["memorised_control"], 10))
    fake = Reconstruction("kkt", torch.rand(10, 1, 8, 8), torch.ones(10), None, RunRecord(final_relative_stationarity=2.0), 0)
    m = exhume.evaluate(fake, train=(train, None), unseen=unseen, figures=False).metrics
    assert m["verdict"] != "leaks" and any("did not find candidates" in f for f in m["assumption_failures"])
    # a pooled portfolio reports a residual per restart: judged by its best restart
    for per, fails in (([0.92, None, 0.7], True), ([0.92, 0.3], False), ([None], False)):
        restarts = tuple(RestartRecord(k, "complete", final_relative_stationarity=r) for k, r in enumerate(per))
        pooled = Reconstruction("kkt", fake.candidates, fake.labels, None, RunRecord(portfolio=PortfolioRecord(restarts)), 0)
        failures = exhume.evaluate(pooled, train=(train, None), unseen=unseen, figures=False).metrics["assumption_failures"]
        assert any("best final relative residual of its 2 restarts 0.7 > 0.5" in f for f in failures) == fails, per
    view = AttackerView(model=nn.Sequential(nn.Flatten(), nn.Linear(64, 1)), task="binary", input_shape=(1, 8, 8), mean=0.0)
    with pytest.raises(exhume.ExhumeError, match="holds no training data"):
        exhume.evaluate(recon, view)
    with pytest.raises(exhume.ExhumeError, match="not both"):
        exhume.evaluate(recon, object(), train=(train, None), unseen=unseen)


def test_progress_writes_at_most_a_line_per_interval_off_a_terminal(monkeypatch):
    from exhume import progress

    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    bar = progress.Progress("kkt attack", 5000, None)
    for it in range(1, 5001):
        bar.update(it, stat="0.1")
    bar.close()
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "kkt attack: it 5000/5000" in lines[0] and "\r" not in err.getvalue()


def test_every_flag_has_help_and_attack_parameters_can_be_listed(capsys):
    import argparse

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield from walk(sp, path + [name])
            elif a.option_strings and not a.help:
                yield path, a.option_strings

    assert list(walk(build_parser(), [])) == []
    assert main(["attack", "--method", "kkt", "--list-params"]) == 0
    out = capsys.readouterr().out
    optimizer = next(line for line in out.splitlines() if line.startswith("optimizer "))
    assert "'adam'" in optimizer and "sgd" in optimizer and " | " in optimizer  # default and choices
    assert any(line.startswith("tv_weight ") and ">= 0.0" in line for line in out.splitlines())
    assert main(["attack", "--method", "nope", "--list-params"]) == 2


def _kkt_result(scale: float, **config) -> Reconstruction:
    cfg = {"formulation": "margin", "lambda_scale_value": scale, "homogeneity_degree": 3.0, "theta_squared": 120.0, **config}
    return Reconstruction(method="kkt", candidates=torch.zeros(2, 1, 4, 4), labels=torch.tensor([1.0, -1.0]), scores=None, seed=0,
                          record=RunRecord(settings=cfg))


def test_without_weight_decay_a_multiplier_scale_far_from_the_margins_makes_finding_nothing_inconclusive():
    from exhume.evaluation.assumptions import NO_DECAY_SCALE_RANGE, scale_failure

    margins = np.full(100, 16.0)  # typical multiplier 120 / (3 · 1600) = 0.025
    assert scale_failure(_kkt_result(0.0125), margins, 0.0) == []  # half of it: where the attack works
    assert scale_failure(_kkt_result(0.025 * NO_DECAY_SCALE_RANGE[1] * 0.99), margins, 0.0) == []
    far = scale_failure(_kkt_result(1.0), margins, 0.0)  # the S = 1 that found nothing on the zoo
    assert len(far) == 1 and "40×" in far[0] and "lambda_scale=0.0125" in far[0]
    assert len(scale_failure(_kkt_result(0.002), margins, 0.0)) == 1  # far below: u cannot grow enough
    # checked only where it was measured: kkt's margin form on models trained without weight decay
    assert scale_failure(_kkt_result(1.0), margins, 5e-3) == []
    assert scale_failure(_kkt_result(1.0, formulation="loss"), margins, 0.0) == []
    bilevel = Reconstruction(method="bilevel", candidates=torch.zeros(2, 1, 4, 4), labels=torch.tensor([1.0, -1.0]), scores=None, seed=0, record=RunRecord())
    assert scale_failure(bilevel, margins, 0.0) == []
    # and it turns "no evidence" into "inconclusive", never a found leak into anything else
    base = {"memorised": 0, "memorised_control": 0, "n_train": 100, "control_size": 100, "pool_size": 900}
    assert decide(base, far).verdict == "inconclusive"
    assert decide({**base, "memorised": 30}, far).verdict == "leaks"


def test_training_images_among_the_unseen_images_are_counted_and_make_nothing_found_inconclusive():
    rng = np.random.default_rng(2)
    train, others = rng.random((12, 10, 10)).astype(np.float32), rng.random((240, 10, 10)).astype(np.float32)
    noise = Reconstruction("kkt", torch.rand(12, 1, 10, 10, generator=torch.Generator().manual_seed(0)), torch.ones(12), None,
                           RunRecord(final_relative_stationarity=0.01), 0)
    clean = exhume.evaluate(noise, train=(train, None), unseen=others, figures=False).metrics
    assert clean.verdict == "no evidence" and clean["control_exact_copies_of_train"] == 0
    with pytest.warns(UserWarning, match="exact copy in the pool"):
        m = exhume.evaluate(noise, train=(train, None), unseen=np.concatenate([others, train]), figures=False).metrics
    assert m["pool_exact_copies_of_train"] + m["control_exact_copies_of_train"] == 12
    assert m["verdict"] == "inconclusive" and "12 of the unseen images (pool and control) are exact copies" in m["verdict_reason"]


def test_the_oracle_control_is_what_the_training_images_themselves_would_score():
    """Control images that are near-copies of training images are matched by a faithful reconstruction:
    ``memorised_control_oracle`` (evaluator-side) counts them, whatever the candidates; candidates equal
    to the training images score exactly that control, random candidates do not."""
    rng = np.random.default_rng(1)
    train = rng.random((10, 12, 12)).astype(np.float32)
    near = np.clip(train[np.arange(40) % 10] + 0.05 * rng.standard_normal((40, 12, 12)), 0, 1).astype(np.float32)
    unseen = np.concatenate([near, rng.random((40, 12, 12)).astype(np.float32)])
    exact = Reconstruction("kkt", torch.from_numpy(train[:, None]).clone(), torch.ones(10), None,
                           RunRecord(final_relative_stationarity=0.01), 0)
    m = exhume.evaluate(exact, train=(train, None), unseen=unseen, figures=False).metrics
    assert m["memorised_control_oracle"] == m["memorised_control"] >= 2 and "ORACLE" in m["memorised_control_oracle_note"]
    noise = Reconstruction("kkt", torch.rand(10, 1, 12, 12, generator=torch.Generator().manual_seed(0)), torch.ones(10), None,
                           RunRecord(final_relative_stationarity=0.01), 0)
    m2 = exhume.evaluate(noise, train=(train, None), unseen=unseen, figures=False).metrics
    assert m2["memorised_control_oracle"] == m["memorised_control_oracle"] and m2["memorised_control"] < m2["memorised_control_oracle"]
    rows = dict(summary_rows(m))
    assert rows["  control if the candidates were the training images (ORACLE)"] == f"{m['memorised_control_oracle']} / 10"
