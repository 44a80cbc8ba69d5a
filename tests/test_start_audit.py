"""The audit with the starting weights known: the threat model it names, the equation it checks, its
settings from Python, TOML and flags, and its one-line refusals."""

from __future__ import annotations

import pytest
import torch
from _start_cases import fine_tuned as _fine_tuned
from _start_cases import forgotten, state
from safetensors.torch import save_file
from torch import nn

from exhume.errors import ConfigError, VictimError


def _audit_data(seed: int = 5):
    model, start, x = _fine_tuned()
    return model, start, (x, torch.tensor([1, 0, 1, 0])), torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


AUDIT = {"loss": "logistic", "weight_decay": 1e-3, "normalize": (0.5, 1.0), "max_seconds": 300, "progress": False, "force": True,
         "attack_args": {"restarts": 1, "iterations": 500}}  # fixed work, not time: the same result on a loaded machine


def test_the_audit_with_the_start_finds_what_weights_only_cannot_and_names_its_threat_model(tmp_path):
    """The tiny fine-tuned victim: with its start, leaks (its 4 points recovered, none of the control), the
    known-start equation's residual small; weights only, inconclusive (far from a stationary point)."""
    import exhume
    from exhume.evaluation.metrics import Metrics

    model, start, train, unseen = _audit_data()
    known = exhume.audit(model, train, unseen, start=start, out=tmp_path / "known", **AUDIT)
    only = exhume.audit(model, train, unseen, out=tmp_path / "only", **AUDIT)
    m, w = known.metrics, only.metrics
    assert known.verdict == "leaks" and m["memorised"] == 4 and m["memorised_control"] == 0
    assert only.verdict == "inconclusive" and w["memorised"] < 4
    assert m["threat_model"] == "the attacker knows the starting weights" and w["threat_model"] == "weights only"
    assert known.reason.endswith("Threat model audited: the attacker knows the starting weights.")
    assert only.reason.endswith("Threat model audited: weights only.")
    assert m["victim"]["stationarity_residual"] < 0.5 < w["victim"]["stationarity_residual"]
    assert "θ_T − c·θ_0" in m["victim"]["stationarity_definition"] and "θ_0" not in w["victim"]["stationarity_definition"]
    assert m["audit"]["start"].startswith("given in Python") and len(m["audit"]["start_digest"]) == 16
    assert Metrics.read(tmp_path / "known" / "evaluation" / "metrics.json")["threat_model"] == m["threat_model"]
    report = (tmp_path / "known" / "report.html").read_text()
    assert "Threat model audited</b>: the attacker knows the starting weights" in report
    # what only the owner measures: the equation at the training images beside the attack's best, membership from the weights
    saved = Metrics.read(tmp_path / "known" / "evaluation" / "metrics.json")
    ident, exposure = saved["identifiability"], saved["membership_exposure"]
    assert ident["residual_at_training"] == m["victim"]["stationarity_residual"] and ident["attack_to_truth"] > 0
    assert set(exposure["scores"]) == {"loss", "loss_drop", "gradient_alignment", "gradient_alignment_start"}
    assert set(w["membership_exposure"]["scores"]) == {"loss", "gradient_alignment"} and w["identifiability"]["attack_to_truth"]
    assert exposure["finding"] in known.reason and exposure["n_members"] == 4 and exposure["n_nonmembers"] == 60
    assert (tmp_path / "known" / "evaluation" / "membership_roc.png").is_file()
    assert 'id="identifiability"' in report and 'id="membership-exposure"' in report


def test_an_audit_whose_start_training_forgot_says_it_solved_the_stationary_equation(tmp_path):
    """The threat model stays the known start; the report and the reason say that the start was not used, and why."""
    import exhume

    model, start, x = forgotten()
    unseen = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    got = exhume.audit(model, (x, torch.tensor([1, 0, 1, 0])), unseen, start=start, out=tmp_path, **AUDIT)
    threat = got.metrics["threat_model"]
    assert threat.startswith("the attacker knows the starting weights; solved the stationary equation: only 0.0")
    assert "training forgot it" in threat and got.reason.endswith(f"Threat model audited: {threat}.")
    assert "θ_0" not in got.metrics["victim"]["stationarity_definition"]  # the stationarity check, as weights only


NET = """
from torch import nn


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
"""


def test_exhume_audit_reads_the_start_and_training_from_its_toml_and_flags(tmp_path, capsys):
    import json

    import numpy as np

    from exhume.cli import main

    model, start, (x, y), unseen = _audit_data()
    (tmp_path / "net.py").write_text(NET)
    save_file(state(model), str(tmp_path / "w.safetensors"))
    save_file(start, str(tmp_path / "start.safetensors"))
    np.savez(tmp_path / "train.npz", x=x.numpy(), y=y.numpy())
    np.savez(tmp_path / "unseen.npz", x=unseen.numpy())
    (tmp_path / "audit.toml").write_text('model = "net.py:Net"\nweights = "w.safetensors"\ntrain = "train.npz"\nunseen = "unseen.npz"\n'
                                         'normalize = "0.5,1.0"\nloss = "logistic"\nweight_decay = 1e-3\nstart = "start.safetensors"\n'
                                         'out = "audit"\n[training]\noptimizer = "sgd"\nlr = 0.5\n'
                                         '[attack_args]\nrestarts = 1\niterations = 50\n')
    assert main(["audit", "--config", str(tmp_path / "audit.toml"), "--no-progress",
                 "--training", '{"optimizer": "sgd", "lr": 0.1, "steps": 50}']) == 0
    assert "threat model audited: the attacker knows the starting weights" in capsys.readouterr().out.lower()
    m = json.loads((tmp_path / "audit" / "evaluation" / "metrics.json").read_text())
    assert m["audit"]["start"] == str(tmp_path / "start.safetensors")
    assert (m["audit"]["training"]["lr"], m["audit"]["training"]["steps"]) == (0.1, 50)  # the flag's table over the file's
    assert m["threat_model"] == "the attacker knows the starting weights"
    save_file({**start, "extra.weight": torch.zeros(2)}, str(tmp_path / "bad.safetensors"))
    assert main(["audit", "--config", str(tmp_path / "audit.toml"), "--no-progress", "--force",
                 "--start-weights", str(tmp_path / "bad.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'extra.weight'" in err and len(err.splitlines()) == 1


def test_training_settings_without_a_start_are_refused_in_one_line():
    import exhume

    model, _, train, unseen = _audit_data()
    with pytest.raises(ConfigError, match="give the starting weights"):
        exhume.audit(model, train, unseen, training={"optimizer": "sgd"}, **AUDIT)


def test_an_unknown_training_setting_of_the_audit_is_refused_naming_it():
    import exhume

    model, start, train, unseen = _audit_data()
    with pytest.raises(ConfigError, match="unknown training setting.*dampening"):
        exhume.audit(model, train, unseen, start=start, training={"dampening": True}, **AUDIT)


def test_a_start_for_an_attack_that_ignores_it_is_refused_by_the_audit():
    import exhume

    model, start, train, unseen = _audit_data()
    with pytest.raises(ConfigError, match="'tldr' attack does not use the starting weights"):
        exhume.audit(model, train, unseen, start=start, method="tldr", **AUDIT)


def test_a_start_of_another_shape_is_refused_by_the_audit_naming_the_parameter():
    import exhume

    model, start, train, unseen = _audit_data()
    with pytest.raises(VictimError, match=r"3.weight has shape \(2, 64\)"):
        exhume.audit(model, train, unseen, start={**start, "3.weight": torch.zeros(2, 64)}, **AUDIT)


def test_a_known_start_run_judged_without_its_start_is_checked_as_unknown_not_as_stationary():
    """exhume evaluate of a run that solved the known-start equation does not hold the start: its
    assumption is unchecked (so never 'no evidence'), not judged by the stationarity equation."""
    from types import SimpleNamespace

    from exhume.attacks.engine.record import parse_record
    from exhume.equations.kinds import KnownStart, Stationarity
    from exhume.evaluation.assumptions import checks_for, equation_of

    eq = equation_of("kkt", recon=SimpleNamespace(record=parse_record({"equation_used": "endpoints"}, {})))
    assert isinstance(eq, KnownStart)
    measured = checks_for(eq).residual(None, None, None, "logistic", 0.0)
    assert measured["value"] is None and "could not be checked" in checks_for(eq).residual_failures(measured)[0]
    assert isinstance(equation_of("kkt", recon=SimpleNamespace(record=parse_record({"equation_used": "stationary"}, {}))), Stationarity)


def test_the_known_start_check_leaves_batchnorm_to_its_residual_and_still_names_smooth_layers():
    """Eval-mode BatchNorm is modelled by the known-start equation (the residual measures whether it holds);
    the stationarity check still names it, and a smooth activation is named by both."""
    from exhume.equations.kinds import KnownStart, Stationarity
    from exhume.evaluation.assumptions import checks_for

    bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 1)).eval()
    smooth = nn.Sequential(nn.Flatten(), nn.Linear(16, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.rand(2, 1, 4, 4)
    known, stationary = checks_for(KnownStart()), checks_for(Stationarity())
    assert known.layer_failures(bn, x) == [] and "BatchNorm2d" in stationary.layer_failures(bn, x)[0]
    assert "tanh" in known.layer_failures(smooth, x)[0]


def test_the_audit_reads_adam_s_state_by_the_user_s_parameter_names(tmp_path):
    """--optimizer-state / optimizer_state=: exp_avg_sq keyed by the user's names (and step) reach the training settings."""
    import exhume

    model, start, train, unseen = _audit_data()
    moment = {f"exp_avg_sq.{k}": torch.full_like(v, 1e-4) for k, v in model.named_parameters()}
    save_file({**moment, "step": torch.tensor([50])}, str(tmp_path / "adam.safetensors"))
    got = exhume.audit(model, train, unseen, start=start, training={"optimizer": "adam", "lr": 1e-3, "steps": 50},
                       optimizer_state=str(tmp_path / "adam.safetensors"), out=tmp_path / "a",
                       **{**AUDIT, "attack_args": {"restarts": 1, "iterations": 20}})
    record = got.metrics["audit"]["training"]
    assert record["second_moment"] == "4 parameter tensors" and record["adam_step"] == 50 and record["optimizer"] == "adam"
