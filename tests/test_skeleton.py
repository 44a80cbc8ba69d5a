"""The shared pieces of issue 13: the image priors, the parameter fragments and the run skeleton."""

from __future__ import annotations

import pytest
import torch

from exhume.attacks import ATTACKS
from exhume.attacks.loop import CANDIDATE_PARAMS, make_optimizer, open_run
from exhume.attacks.priors import project_range, range_penalty
from exhume.errors import ExhumeError


def test_range_penalty_and_projection_by_hand():
    v = torch.tensor([[-0.5, 0.2], [1.0, 1.3]])
    assert range_penalty(v, 0.0, 1.0).item() == pytest.approx(0.25 + 0.09)
    assert range_penalty(v.clamp(0, 1), 0.0, 1.0).item() == 0.0
    x = torch.tensor([-2.0, 0.1, 3.0]).requires_grad_()
    project_range(x, torch.tensor([-1.0, -1.0, -1.0]), 2.0)
    assert x.tolist() == pytest.approx([-1.0, 0.1, 2.0]) and x.requires_grad


def test_kkt_and_bilevel_share_one_parameter_fragment():
    kkt, bilevel = ATTACKS["kkt"].params, ATTACKS["bilevel"].params
    for name in ("optimizer", "momentum", "weight_decay"):
        assert kkt[name] is CANDIDATE_PARAMS[name] and bilevel[name] is CANDIDATE_PARAMS[name]
    # bilevel solves its lower level to 1e-9, so it alone defaults to float64 (same choices)
    assert kkt["dtype"] is CANDIDATE_PARAMS["dtype"] and bilevel["dtype"].default == "float64"
    assert bilevel["dtype"].choices == CANDIDATE_PARAMS["dtype"].choices
    for params in (kkt, bilevel, ATTACKS["tldr"].params):
        assert {"max_seconds", "checkpoint_every", "log_every"} <= set(params)


def test_open_run_restores_in_place_and_refuses_other_settings(tmp_path):
    x = torch.zeros(3, requires_grad=True)
    opt = make_optimizer("sgd", [x], 0.1, momentum=0.5)
    run = open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1}})
    x.grad = torch.ones(3)
    opt.step()
    run.history.append({"iteration": 4})
    run.save(4, 1.5)
    y = torch.zeros(3, requires_grad=True)
    opt2 = make_optimizer("sgd", [y], 0.1, momentum=0.5)
    again = open_run(tmp_path, True, {"x": y}, {"opt": opt2}, {"config": {"lr": 0.1}})
    assert (again.start, again.elapsed, again.history) == (4, 1.5, [{"iteration": 4}])
    assert torch.equal(y.detach(), x.detach()) and opt2.state_dict()["state"][0]["momentum_buffer"].tolist() == [1.0] * 3
    with pytest.raises(ExhumeError, match=r"other settings \(lr=0\.1 there, 0\.2 here\); use the same settings") as err:
        open_run(tmp_path, True, {"x": y}, {"opt": opt2}, {"config": {"lr": 0.2}})
    assert "{" not in str(err.value)  # the differing setting, not the whole settings
    fresh = open_run(tmp_path, False, {"x": y}, {"opt": opt2}, {"config": {"lr": 0.2}})  # without resume: a new run
    assert fresh.start == 0 and fresh.history == []
