"""The shared pieces of issue 13: the image priors, the parameter fragments and the run skeleton."""

from __future__ import annotations

import pytest
import torch

from exhume.attacks import ATTACKS
from exhume.attacks.engine.loop import CANDIDATE_PARAMS, make_optimizer, open_run
from exhume.attacks.engine.priors import project_range, range_penalty
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
    for name in ("optimizer", "lr"):
        assert kkt[name].kind is CANDIDATE_PARAMS[name].kind and bilevel[name] is CANDIDATE_PARAMS[name]
    # bilevel solves its lower level to 1e-9, so it alone defaults to float64 (same choices)
    assert kkt["dtype"] is CANDIDATE_PARAMS["dtype"] and bilevel["dtype"].default == "float64"
    assert bilevel["dtype"].choices == CANDIDATE_PARAMS["dtype"].choices


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_no_attack_declares_the_runs_plumbing_or_the_victims_facts_and_each_run_takes_them(name):
    """The deadline and the cadence are how a run is bounded and recorded, the loss and weight decay facts about the
    victim (its view's): no attack declares them as settings; every run takes the deadline and cadence as keywords,
    and giving one as a setting is one line saying where it went."""
    import inspect

    from exhume.attacks.engine.base import MOVED
    from exhume.errors import ConfigError

    cls = ATTACKS[name]
    assert set(MOVED).isdisjoint(cls.params)
    assert {"deadline", "checkpoint_every", "log_every"} <= set(inspect.signature(cls.run).parameters)
    with pytest.raises(ConfigError, match=r"max_seconds is a budget: pass it to exhume.attack .*--max-seconds"):
        cls(max_seconds=5)
    with pytest.raises(ConfigError, match=r"weight_decay is a fact about the victim: .*--weight-decay"):
        cls(weight_decay=1e-3)


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
    open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1}}).save(4, 1.0)  # written before "denoise"
    now = {"config": {"lr": 0.1, "denoise": "auto"}}
    with pytest.raises(ExhumeError, match=r"denoise='\(unset\)' there, 'auto' here"):
        open_run(tmp_path, True, {"x": x}, {"opt": opt}, now)  # without the defaults: refused as before
    assert open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, defaults={"lr": 0.5, "denoise": "auto"}).start == 4
    with pytest.raises(ExhumeError, match=r"denoise='auto' there, 'off' here"):
        open_run(tmp_path, True, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1, "denoise": "off"}},
                 defaults={"denoise": "auto"})


def test_a_checkpoint_with_a_retired_setting_resumes_at_the_values_that_did_what_the_attack_does_now(tmp_path):
    """A setting the attack no longer has: accepted at a value ``retired`` lists (momentum 0.9 for every attack on
    candidate images), refused at another, naming it; a setting neither current nor retired is refused too."""
    x = torch.zeros(3, requires_grad=True)
    opt = make_optimizer("sgd", [x], 0.1)
    now = {"config": {"lr": 0.1}}
    for config, refused in (({"momentum": 0.9, "keep": "best"}, None), ({"momentum": 0.5}, "momentum=0.5 there"),
                            ({"keep": "last"}, "keep='last' there"), ({"other": 1}, "other=1 there")):
        open_run(tmp_path, False, {"x": x}, {"opt": opt}, {"config": {"lr": 0.1, **config}}).save(4, 1.0)
        if refused is None:
            assert open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, retired={"keep": ("best",)}).start == 4
            continue
        with pytest.raises(ExhumeError, match=refused):
            open_run(tmp_path, True, {"x": x}, {"opt": opt}, now, retired={"keep": ("best",)})


def test_kkt_resumes_a_checkpoint_written_before_its_newer_settings(tmp_path, victim_dir, one_thread):
    """End to end: a kkt checkpoint whose config lacks settings added since (as written by an older exhume) resumes."""
    from exhume.attacks import get_attack
    from exhume.files.torchfile import load_torch, save_torch
    from exhume.victim import load_victim

    view = load_victim(victim_dir).attacker_view()
    get_attack("kkt", iterations=3).run(view, seed=0, out=tmp_path, checkpoint_every=1)
    path = tmp_path / "checkpoint.pt"
    payload = load_torch(path, "test", "checkpoint")
    for key in ("multipliers", "start_equation", "preconditioner"):
        payload["state"]["config"].pop(key)
    save_torch(path, payload)
    again = get_attack("kkt", iterations=5).run(view, seed=0, out=tmp_path, resume=True, checkpoint_every=1)
    assert again.record.iterations == 5


def test_a_checkpoint_that_recorded_the_moved_settings_resumes(tmp_path, victim_dir, one_thread):
    """A kkt checkpoint written when the budget, the cadence and the victim's facts were settings: whatever it recorded
    of the run's seconds and cadence, it resumes; its loss and weight decay resume where they were left to the
    metadata (None) or say what the view says now, and another weight decay is refused, naming it."""
    from exhume.attacks import get_attack
    from exhume.files.torchfile import load_torch, save_torch
    from exhume.victim import load_victim

    view = load_victim(victim_dir).attacker_view()
    get_attack("kkt", iterations=3).run(view, seed=0, out=tmp_path, checkpoint_every=1)
    path = tmp_path / "checkpoint.pt"
    written = load_torch(path, "test", "checkpoint")
    old = {"max_seconds": 30.0, "checkpoint_every": 1, "log_every": 7}
    for facts, refused in (({"weight_decay": None, "loss": None}, None), ({"weight_decay": view.weight_decay, "loss": view.loss}, None),
                           ({"weight_decay": 0.123, "loss": None}, "weight_decay=0.123 there")):
        written["state"]["config"].update(old, **facts)
        save_torch(path, written)
        run = get_attack("kkt", iterations=4)
        if refused is None:
            assert run.run(view, seed=0, out=tmp_path, resume=True, progress=False).record.iterations == 4
            continue
        with pytest.raises(ExhumeError, match=refused):
            run.run(view, seed=0, out=tmp_path, resume=True, progress=False)
