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


def test_a_checkpoint_older_than_a_setting_resumes_at_its_default(tmp_path):
    """A setting added to exhume after a checkpoint was written counts as its default (the older run's behaviour);
    another value of it is still refused, naming it."""
    x = torch.zeros(3, requires_grad=True)
    opt = make_optimizer("sgd", [x], 0.1)
    open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1}}).save(4, 1.0)  # written before "surrogate"
    now = {"config": {"lr": 0.1, "surrogate": "fixed"}}
    with pytest.raises(ExhumeError, match=r"surrogate='\(unset\)' there, 'fixed' here"):
        open_run(tmp_path, True, {"x": x}, {"opt": opt}, now)  # without the defaults: refused as before
    assert open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, defaults={"lr": 0.5, "surrogate": "fixed"}).start == 4
    with pytest.raises(ExhumeError, match=r"surrogate='fixed' there, 'layer-scaled' here"):
        open_run(tmp_path, True, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1, "surrogate": "layer-scaled"}},
                 defaults={"surrogate": "fixed"})


def test_a_checkpoint_with_a_removed_setting_resumes_at_its_retired_value(tmp_path):
    """A setting removed from exhume since the checkpoint was written (``Attack.retired``, in the defaults) is dropped
    where it holds the value that behaved as runs do now; another value is refused, naming it."""
    x = torch.zeros(3, requires_grad=True)
    opt = make_optimizer("sgd", [x], 0.1)
    now, defaults = {"config": {"lr": 0.1}}, {"lr": 0.1, "run": "exact"}
    open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1, "run": "exact"}}).save(4, 1.0)
    assert open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, defaults=defaults).start == 4
    open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1, "run": "coarse"}}).save(4, 1.0)
    with pytest.raises(ExhumeError, match=r"run='coarse' there, '\(unset\)' here"):
        open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, defaults=defaults)


def test_kkt_resumes_a_checkpoint_written_before_its_newer_settings(tmp_path, victim_dir, one_thread):
    """End to end: a kkt checkpoint whose config lacks settings added since (as written by an older exhume) resumes."""
    from exhume.attacks import get_attack
    from exhume.files.torchfile import load_torch, save_torch
    from exhume.victim import load_victim

    view = load_victim(victim_dir).attacker_view()
    get_attack("kkt", iterations=3, checkpoint_every=1).run(view, seed=0, out=tmp_path)
    path = tmp_path / "checkpoint.pt"
    payload = load_torch(path, "test", "checkpoint")
    for key in ("surrogate", "multipliers", "sphere"):
        payload["state"]["config"].pop(key)
    save_torch(path, payload)
    again = get_attack("kkt", iterations=5, checkpoint_every=1).run(view, seed=0, out=tmp_path, resume=True)
    assert again.record.iterations == 5
