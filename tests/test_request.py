"""The request for a run (exhume.request): each field checked when it is made (one line naming it), the short form and
the request form of exhume.attack giving the same candidates, and the start attached once, by one function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from _start_cases import fine_tuned

import exhume
from exhume.attacks import get_attack
from exhume.errors import ConfigError
from exhume.request import Budget, Output, Request, ThreatModel, view_of
from exhume.victim import AttackerView

EXHUME = Path(__file__).resolve().parents[1] / "exhume"
pytestmark = pytest.mark.usefixtures("one_thread")  # bit-for-bit comparisons (conftest.py)


@pytest.mark.parametrize("kind, kwargs, message", [
    (ThreatModel, {"start": 3}, "start must be a weights file or a dict of parameter names to tensors, got int"),
    (ThreatModel, {"training": {"optimizer": "sgd"}}, "give the starting weights too"),
    (ThreatModel, {"start_partial": True}, "start_partial describe training from a start"),
    (ThreatModel, {"start": "s.safetensors", "start_partial": "yes"}, "start_partial must be True or False, got 'yes'"),
    (ThreatModel, {"start": "s.safetensors", "training": {"dampening": 0.1}}, "unknown training setting.*dampening"),
    (ThreatModel, {"start": "s.safetensors", "training": {"lr": -1.0}}, "lr"),
    (ThreatModel, {"start": "s.safetensors", "optimizer_state": 5}, "optimizer_state must be a file path, got int"),
    (ThreatModel, {"loss": "hinge"}, "unknown loss 'hinge'; known: "),
    (ThreatModel, {"weight_decay": -1e-3}, r"weight_decay: expected a number in \[0.0, inf\], got -0.001"),
    (Budget, {"max_seconds": 0}, "max_seconds must be a positive number of seconds, got 0"),
    (Budget, {"max_seconds": float("inf")}, "max_seconds must be a positive number of seconds, got inf"),
    (Budget, {"max_seconds": "60"}, "max_seconds must be a positive number of seconds, got '60'"),
    (Budget, {"iterations": 0}, "iterations must be a positive integer, got 0"),
    (Budget, {"iterations": 2.5}, "iterations must be a positive integer, got 2.5"),
    (Budget, {"restarts": 0}, "restarts expects a positive integer or 'auto', got 0"),
    (Budget, {"restarts": "many"}, "restarts expects a positive integer or 'auto', got 'many'"),
    (Budget, {"workers": True}, "workers must be a positive integer, got True"),
    (Budget, {"device": "gpu0"}, "unknown device 'gpu0'"),
    (Budget, {"dtype": "float16"}, "dtype must be one of float32, float64, got 'float16'"),
    (Budget, {"batch_restarts": "yes"}, "batch_restarts must be one of auto, on, off, got 'yes'"),
    (Output, {"folder": 7}, "out must be a folder path, got int"),
    (Output, {"force": 1}, "force must be True or False, got 1"),
    (Output, {"resume": "no"}, "resume must be True or False, got 'no'"),
    (Output, {"checkpoint_every": 0}, "checkpoint_every: expected an integer in"),
    (Output, {"log_every": 2.5}, "log_every: expected an integer"),
    (Request, {"budget": {"max_seconds": 60}}, "request budget must be a Budget, got dict"),
])
def test_a_bad_field_is_refused_when_the_request_is_made_in_one_line(kind, kwargs, message):
    with pytest.raises(ConfigError, match=message) as e:
        kind(**kwargs)
    assert "\n" not in str(e.value)


def test_a_request_and_the_same_setting_as_a_keyword_is_refused_naming_it():
    from exhume.deadline import Deadline
    from exhume.request import deadline_of

    with pytest.raises(ConfigError, match="max_seconds: set in request= already"):
        Request.of(Request(budget=Budget(max_seconds=5)), {"max_seconds": 6, "lr": 0.1})
    with pytest.raises(ConfigError, match="iterations given twice"):
        Budget(iterations=5).attack_settings("kkt", {"iterations": 6})
    with pytest.raises(ConfigError, match="max_seconds and deadline= both given"):
        deadline_of(Request(budget=Budget(max_seconds=5)), Deadline.after(5))
    assert deadline_of(Request(budget=Budget(max_seconds=5))).seconds == 5 and not deadline_of(Request()).bounded


def test_the_victims_loss_and_weight_decay_are_stated_in_the_threat_model_and_refused_against_its_metadata():
    """What the victim's metadata lacks the attacker may state; what it records may not be contradicted (both named)."""
    model, _, _ = fine_tuned()
    bare = AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5))
    stated = view_of(bare, ThreatModel(loss="logistic", weight_decay=1e-3))
    assert (stated.loss, stated.weight_decay) == ("logistic", 1e-3) and bare.loss is None, "the view given is left as it was"
    assert view_of(stated, ThreatModel(weight_decay=1e-3)) is stated  # the same fact again: nothing to add
    with pytest.raises(ConfigError, match=r"weight_decay 0\.01 was stated, but the victim's metadata records 0\.001"):
        view_of(stated, ThreatModel(weight_decay=0.01))
    request, rest = Request.of(None, {"loss": "logistic", "weight_decay": 1e-3, "checkpoint_every": 5, "lr": 0.1})
    assert request.threat == ThreatModel(loss="logistic", weight_decay=1e-3) and rest == {"lr": 0.1}
    assert request.output.every == (5, None)


def test_flat_keywords_are_sorted_into_the_request_and_the_attack_keeps_its_own():
    request, rest = Request.of(None, {"max_seconds": 60, "restarts": "3", "out": "runs/a", "force": True, "lr": 0.5, "m": 20})
    assert request == Request(budget=Budget(max_seconds=60, restarts=3), output=Output("runs/a", force=True))
    assert rest == {"lr": 0.5, "m": 20}
    assert Budget(iterations=7, dtype="float64", max_seconds=9).attack_settings("tldr", {"eps": 0.1}) == {
        "eps": 0.1, "steps": 7, "dtype": "float64"}  # the attack's own step budget, named as it declares it


def test_the_short_form_and_the_request_form_give_the_same_candidates(victim_dir):
    victim = exhume.load_victim(victim_dir)
    short = exhume.attack(victim, method="kkt", seed=4, restarts=1, iterations=30, progress=False)
    asked = exhume.attack(victim, method="kkt", seed=4, request=Request(budget=Budget(restarts=1, iterations=30)), progress=False)
    direct = get_attack("kkt", iterations=30).run(victim.attacker_view(), seed=4, progress=False)
    assert torch.equal(short.candidates, asked.candidates) and torch.equal(short.candidates, direct.candidates)
    pooled = exhume.attack(victim, seed=1, restarts=2, workers=1, iterations=20, lr=0.5, progress=False)
    again = exhume.attack(victim, seed=1, lr=0.5, progress=False,
                          request=Request(budget=Budget(restarts=2, workers=1, iterations=20)))
    plan = [[(r.restart, r.seed, dict(r.overrides), r.iterations) for r in x.record.portfolio.restarts] for x in (pooled, again)]
    assert torch.equal(pooled.candidates, again.candidates) and plan[0] == plan[1] and len(plan[0]) == 2


def _view(model) -> AttackerView:
    return AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5), loss="logistic",
                        weight_decay=1e-3, n_train_hint=4)


def test_the_view_of_a_request_with_a_start_has_it_and_a_weights_only_one_has_none(tmp_path):
    from safetensors.torch import save_file

    model, start, _ = fine_tuned()
    save_file(start, str(tmp_path / "start.safetensors"))
    plain = _view(model)
    assert view_of(plain) is plain and view_of(plain, ThreatModel()) is plain and plain.start is None
    known = view_of(plain, ThreatModel(start=str(tmp_path / "start.safetensors"), training={"optimizer": "sgd", "lr": 0.1}))
    assert known.start is not None and set(known.start) == {k for k, _ in model.named_parameters()}
    assert known.training.lr == 0.1 and known.threat_model == "the attacker knows the starting weights"
    assert plain.start is None, "the view given is left as it was"
    with pytest.raises(ConfigError, match="expected a Victim or an AttackerView, got Linear"):
        view_of(torch.nn.Linear(2, 1))


def test_exhume_attack_attaches_the_start_once_and_gives_what_the_view_built_by_hand_gives(monkeypatch):
    import exhume.victim.start as start_mod

    model, start, _ = fine_tuned()
    calls = []
    check = start_mod.check_start
    monkeypatch.setattr(start_mod, "check_start", lambda *a, **k: calls.append(1) or check(*a, **k))
    training = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 1e-3, "steps": 50}
    pooled = exhume.attack(_view(model), restarts=2, workers=1, iterations=10, progress=False, start=start, training=training)
    assert len(calls) == 1 and pooled.record.threat_model == "the attacker knows the starting weights"
    request = Request(threat=ThreatModel(start=start, training=training), budget=Budget(restarts=1, iterations=25))
    one = exhume.attack(_view(model), request=request, progress=False)
    by_hand = AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5), loss="logistic",
                           weight_decay=1e-3, n_train_hint=4, start=check(start, model), training=start_mod.TrainingSettings(**training))
    direct = get_attack("kkt", iterations=25).run(by_hand, progress=False)
    assert torch.equal(one.candidates, direct.candidates) and one.record.equation is direct.record.equation


def _called(path: Path) -> set[str]:
    """The names of the functions and methods ``path`` calls."""
    return {getattr(n.func, "attr", getattr(n.func, "id", None)) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)}


def test_one_function_makes_the_view_and_attaches_the_start():
    """Above the victim room, only exhume/request.py checks or loads a start, or turns a Victim into its view, on
    behalf of a run (the experiments and benchmarks, which hold a Victim of their own, call its attacker_view)."""
    called = {str(p.relative_to(EXHUME)): _called(p) for p in EXHUME.rglob("*.py") if p.parts[-2] != "victim"}
    for name in ("check_start", "load_start", "with_optimizer_state"):
        assert sorted(p for p, names in called.items() if name in names) == ["request.py"], name
    for room in ("api.py", "portfolio/", "tune/", "audit/", "cli.py"):
        making = sorted(p for p, names in called.items() if p.startswith(room) and "attacker_view" in names)
        assert not making, f"{making} make an attacker's view themselves: use exhume.request.view_of"


def test_tune_takes_the_request_its_trials_view_has_the_start_and_a_budget_it_cannot_spend_is_refused(tmp_path):
    from exhume.tune import tune
    from exhume.tune.study import _searchable

    model, start, _ = fine_tuned()
    space, view = _searchable(_view(model), 1, 1.0, {}, "kkt", ThreatModel(start=start))
    assert space and view.start is not None and set(view.start) == {k for k, _ in model.named_parameters()}
    with pytest.raises(ConfigError, match="restarts: a tune trial is one run bounded by its seconds"):
        tune(_view(model), 1, request=Request(budget=Budget(restarts=2), output=Output(tmp_path / "t")))
    with pytest.raises(ConfigError, match="tune writes its study and trials into a folder: give out="):
        tune(_view(model), 1, trial_seconds=1.0)
    assert not (tmp_path / "t").exists()


def _imported(path: Path) -> set[str]:
    """The exhume modules ``path`` imports (at its top or inside a function)."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return {m for m in names if m.startswith("exhume")}


def test_the_request_sits_above_the_victim_and_the_attacks_and_below_the_runs():
    below = ("exhume.victim", "exhume.attacks", "exhume.choices", "exhume.errors", "exhume.params", "exhume.device",
             "exhume.deadline", "exhume.files", "exhume.losses")
    assert all(m.startswith(below) for m in _imported(EXHUME / "request.py")), _imported(EXHUME / "request.py")
    for room in ("victim", "attacks", "evaluation"):
        importing = sorted(str(p.relative_to(EXHUME)) for p in (EXHUME / room).rglob("*.py") if "exhume.request" in _imported(p))
        assert not importing, f"{importing} import the request: an import running back up"
