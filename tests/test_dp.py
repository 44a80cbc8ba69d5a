"""Differentially private victims (DP-SGD through Opacus), the reconstruction bounds beside them, and the audit of one."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from _extras import need
from torch import nn

from exhume.cli import main
from exhume.errors import ConfigError

need("opacus", "dp")

from opacus.accountants import RDPAccountant  # noqa: E402
from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

from exhume.victim import MiniBatchConfig, TrainConfig, load_victim, make_victim  # noqa: E402
from exhume.victim.private import DPConfig, train_private  # noqa: E402

TINY = {"data": "mnist", "task": "odd-even", "n": 10, "arch": "mlp:16;bias=all", "test_size": 50, "progress": False}


def _full(epochs=20, **kw):
    return TrainConfig(loss="logistic", lr=0.1, weight_decay=5e-3, max_epochs=epochs, **kw)


def _accountant_epsilon(dp: dict) -> float:
    acc = RDPAccountant()
    acc.history = [(dp["noise_multiplier"], dp["sample_rate"], dp["steps"])]
    return acc.get_epsilon(dp["delta"])


def test_a_tiny_dp_victim_records_what_opacus_accountant_reports(tmp_path):
    victim = make_victim(**TINY, train=_full(), private=DPConfig(epsilon=8.0, delta=1e-5, max_grad_norm=0.5))
    dp = victim.privacy
    assert (dp["sample_rate"], dp["steps"], dp["planned_steps"], dp["expected_batch_size"]) == (1.0, 20, 20, 10)
    assert dp["noise_multiplier"] == get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=1.0, steps=20,
                                                          accountant="rdp")
    assert dp["epsilon_spent"] == pytest.approx(_accountant_epsilon(dp), rel=1e-12) and dp["epsilon_spent"] <= 8.0
    assert (dp["epsilon"], dp["delta"], dp["accountant"], dp["max_grad_norm"]) == (8.0, 1e-5, "rdp", 0.5)
    victim.save(tmp_path / "v")
    again = load_victim(tmp_path / "v")  # the plain module's names: an ordinary victim folder
    assert again.privacy == dp and set(again.start) == {k for k, _ in again.model.named_parameters()}
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), victim.model.state_dict().values()))
    assert not torch.equal(again.start["net.0.weight"], again.model.net[0].weight)


def test_mini_batch_dp_samples_by_poisson_at_opacus_rate_and_counts_its_steps():
    victim = make_victim(**{**TINY, "n": 12}, train=MiniBatchConfig(loss="logistic", optimizer="sgd", lr=0.05, batch_size=4, epochs=3),
                         private=DPConfig(noise_multiplier=1.0, max_grad_norm=1.0))
    dp = victim.privacy
    assert dp["sample_rate"] == pytest.approx(1 / 3) and dp["steps"] == dp["planned_steps"] == 9
    assert dp["epsilon_spent"] == pytest.approx(_accountant_epsilon(dp), rel=1e-12)


def test_the_noise_is_secret_unless_seeded_and_the_record_says_which():
    """Two victims from one seed differ by their noise (drawn from the operating system, not recorded); a noise_seed
    replays it exactly, and the record says that it can be replayed."""
    kw = {**TINY, "train": _full(10)}
    secret = [make_victim(**kw, private=DPConfig(noise_multiplier=1.0)) for _ in range(2)]
    seeded = [make_victim(**kw, private=DPConfig(noise_multiplier=1.0, noise_seed=7)) for _ in range(2)]
    assert not torch.equal(secret[0].model.net[0].weight, secret[1].model.net[0].weight)
    assert all(torch.equal(a, b) for a, b in zip(seeded[0].model.parameters(), seeded[1].model.parameters()))
    assert secret[0].privacy["randomness"].startswith("secret") and secret[0].privacy["secure_mode"] is False
    assert "replay" in seeded[0].privacy["randomness"] and "7" in seeded[0].privacy["randomness"]
    with pytest.raises(ConfigError, match="give one or the other"):
        DPConfig(epsilon=1.0, secure_mode=True, noise_seed=1)


def test_opacus_warnings_pass_through_but_those_handled_and_the_accountants_are_recorded(monkeypatch):
    """The secure-generator and backward-hook warnings are handled (recorded or internal); the accountant's range of
    orders is recorded; any other warning reaches the caller."""
    import warnings

    import opacus

    class Noisy(opacus.PrivacyEngine):
        def __init__(self, **kw):
            super().__init__(**kw)
            warnings.warn("something Opacus means the user to read", stacklevel=2)

    monkeypatch.setattr(opacus, "PrivacyEngine", Noisy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        victim = make_victim(**{**TINY, "n": 12}, train=MiniBatchConfig(loss="logistic", optimizer="sgd", lr=0.05, batch_size=6, epochs=2),
                             private=DPConfig(epsilon=1000.0))
    texts = [str(w.message) for w in caught]
    assert texts == ["something Opacus means the user to read"], texts
    assert any("smallest alpha" in w for w in victim.privacy["accountant_warnings"])


def test_ghost_clipping_equals_opacus_per_sample_gradients():
    """The fast path (ghost clipping's norms) against the general one (Opacus's per-sample gradients), no noise."""
    got = [make_victim(**TINY, train=_full(10), private=DPConfig(noise_multiplier=0.0, max_grad_norm=0.05, grad_sample_mode=mode))
           for mode in ("ghost", "hooks")]
    for a, b in zip(got[0].model.parameters(), got[1].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[0].privacy["epsilon_spent"] is None and "not private" in got[0].privacy["mechanism"]


def test_clipping_that_never_bites_at_rate_one_is_ordinary_gradient_descent():
    """Noise 0, a clipping norm above every gradient, the full batch: the objective mean loss + (w/2)·‖θ‖² of train_victim."""
    private = make_victim(**TINY, train=_full(15), private=DPConfig(noise_multiplier=0.0, max_grad_norm=1e6))
    plain = make_victim(**TINY, train=_full(15), public_centring=True)  # a private victim is centred by a public mean
    for a, b in zip(private.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert plain.privacy is None and plain.start is None


def test_a_model_opacus_cannot_make_private_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        make_victim("mnist", "multiclass", 10, "convnet:4;fc=8", MiniBatchConfig(batch_size=5, epochs=1), test_size=0,
                    progress=False, private=DPConfig(epsilon=10.0))
    assert "Opacus cannot make ConvNet private" in str(e.value) and "BatchNorm" in str(e.value) and "\n" not in str(e.value)


def test_an_epsilon_out_of_reach_and_a_loss_stopping_rule_are_refused():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 1))
    x, y = torch.randn(8, 1, 2, 2), torch.tensor([1.0, -1.0] * 4)
    with pytest.raises(ConfigError, match=r"ε = 1e-05 \(δ = 1e-05\) cannot be reached in 20 steps at sampling rate 1"):
        train_private(model, x, y, _full(20), DPConfig(epsilon=1e-5), progress=False)
    for rule in ({"loss_threshold": 0.1}, {"span_threshold": 1e-4}):
        with pytest.raises(ConfigError, match="runs its planned epochs"):
            train_private(model, x, y, _full(20, **rule), DPConfig(epsilon=1.0), progress=False)
    with pytest.raises(ConfigError, match="gdp accountant is a central-limit approximation"):
        train_private(model, x, y, _full(20), DPConfig(epsilon=1.0, accountant="gdp"), progress=False)
    with pytest.raises(ConfigError, match="exactly one of epsilon"):
        DPConfig(epsilon=1.0, noise_multiplier=1.0)


def test_exhume_train_with_dp_records_it_and_keeps_the_start(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["train", "-n", "10", "--arch", "mlp:16;bias=all", "--epochs", "20", "--dp-epsilon", "8", "--max-grad-norm", "0.5",
                 "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ε = " in printed and "noise multiplier" in printed and (out / "start.safetensors").is_file()
    assert load_victim(out).privacy["epsilon"] == 8.0
    assert main(["train", "-n", "10", "--dp-epsilon", "8", "--no-progress", "-o", str(tmp_path / "w")]) == 2
    assert "needs --epochs" in capsys.readouterr().err


def test_exhume_train_refuses_every_flag_private_training_cannot_honour(tmp_path, capsys):
    """A stopping rule with --dp-epsilon, a DP flag without it, gdp at rate 1, secure mode without torchcsprng: one line each."""
    base = ["train", "-n", "10", "--arch", "mlp:16;bias=all", "--epochs", "3", "--no-progress", "-o", str(tmp_path / "v")]
    for extra, line in ((["--dp-epsilon", "8", "--span-threshold", "1e-4"], "--span-threshold would stop training"),
                        (["--dp-noise-seed", "3"], "give --dp-epsilon (or --dp-noise-multiplier) too"),
                        (["--dp-epsilon", "8", "--dp-accountant", "gdp"], "gdp accountant is a central-limit approximation"),
                        (["--dp-epsilon", "8", "--dp-secure-mode"], "secure mode (--dp-secure-mode) needs the torchcsprng")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert line in err and len(err.strip().splitlines()) == 1, err
    assert main([*base, "--dp-epsilon", "8", "--dp-noise-seed", "3"]) == 0
    assert "replay" in capsys.readouterr().out and load_victim(tmp_path / "v").privacy["randomness"].startswith("seeded")


def test_an_ordinary_victim_keeps_its_start_when_asked_and_a_replaced_one_leaves_none(tmp_path):
    out = tmp_path / "v"
    assert main(["train", "-n", "10", "--arch", "mlp:16;bias=all", "--epochs", "5", "--keep-start", "--no-progress", "-o", str(out)]) == 0
    kept = load_victim(out)
    assert kept.privacy is None and set(kept.start) == {k for k, _ in kept.model.named_parameters()}
    assert main(["train", "-n", "10", "--arch", "mlp:16;bias=all", "--epochs", "5", "--no-progress", "--force", "-o", str(out)]) == 0
    assert not (out / "start.safetensors").exists() and load_victim(out).start is None


def test_exhume_train_dp_without_opacus_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "opacus", None)  # import opacus raises ImportError
    assert main(["train", "-n", "10", "--epochs", "5", "--dp-epsilon", "8", "--no-progress", "-o", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "exhume[dp]"' in err and len(err.strip().splitlines()) == 1


def _table():
    settings = {"paper": {"start_known": False, "what": "full batch, weights only"},
                "minibatch": {"start_known": True, "what": "mini-batch, start known"}}

    def rate(f):
        return {"rate": f, "successes": round(100 * f), "trials": 100, "low": 0.0, "high": 1.0}

    points = [{"setting": s, "level": lv, "epsilon": e, "uninformed": rate(f), "game_8": rate(g)} for s in settings
              for lv, e, f, g in (("none", None, 0.3, 1.0), ("1000", 1000.0, 0.2, 0.9), ("100", 100.0, 0.05, 0.5),
                                  ("10", 10.0, 0.0, 0.2), ("1", 1.0, 0.0, 0.12))]
    return {"points": points, "settings": settings, "measured_on": "MNIST", "date": "2026-12-07", "command": "exhume experiment dp"}


def test_the_audit_reads_the_reference_curve_as_context_and_never_extrapolates():
    from exhume.audit.dp import reference_reading

    at = reference_reading(100.0, True, _table())
    assert at["status"] == "read" and at["percent"] == [5, 5] and at["setting"] == "minibatch"
    assert at["reading"].startswith("context, not your model: on exhume's reference victim (mini-batch, start known")
    assert "game at k = 8 named 50 %" in at["reading"] and "models like yours" not in at["reading"]
    between = reference_reading(300.0, False, _table())
    assert between["percent"] == [5, 20] and between["at_epsilons"] == [100.0, 1000.0] and between["setting"] == "paper"
    assert reference_reading(0.1, True, _table())["status"] == "outside the measured range"


def _private_model(steps=30):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([1, 0] * 4)
    got = train_private(model, x - 0.5, torch.where(y == 1, 1.0, -1.0), _full(steps), DPConfig(epsilon=10.0, noise_seed=3), progress=False)
    return model, x, y, got["dp"]


def test_the_audit_of_a_dp_model_runs_the_informed_adversary_beside_its_own_mechanisms_bound(tmp_path, capsys):
    """The owner states σ, q = 1 and T: each game's bound is the Gaussian closed form Φ(Φ⁻¹(1/k) + √T/σ) of that mechanism;
    one line per measured success, each with its interval; the reference curve only as context."""
    from scipy.stats import norm

    import exhume
    from exhume.audit.command import _print_verdict

    model, x, y, dp = _private_model()
    unseen = torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    sigma, steps = dp["noise_multiplier"], dp["steps"]
    got = exhume.audit(model, (x, y), unseen, out=tmp_path, loss="logistic", weight_decay=5e-3, normalize=(0.5, 1.0), progress=False,
                       force=True, dp_epsilon=10.0, dp_noise_multiplier=sigma, dp_sample_rate=1.0, dp_steps=steps, dp_targets=4,
                       attack_args={"restarts": 1, "iterations": 20})
    rec = got.metrics["dp"]
    assert rec["informed"]["targets"] == 4 and set(rec["informed"]["games"]) == {"2", "8"}  # 10 distractors: no k = 100
    for k in ("2", "8"):
        assert rec["bounds"][k]["value"] == pytest.approx(norm.cdf(norm.ppf(1 / int(k)) + math.sqrt(steps) / sigma), abs=1e-12)
        r = rec["informed"]["games"][k]
        assert r["trials"] == 4 and r["low"] <= r["rate"] <= r["high"]
    _print_verdict(got, tmp_path)
    out = capsys.readouterr().out
    assert "dp, informed: the candidate game at k = 8" in out and "95 % interval" in out and f"σ = {sigma:g}" in out
    assert "models like yours" not in out and "Differential privacy" in (tmp_path / "report.html").read_text()
    with pytest.raises(ConfigError, match="give --dp-sample-rate, --dp-steps too"):
        exhume.audit(model, (x, y), unseen, loss="logistic", weight_decay=5e-3, normalize=(0.5, 1.0), dp_epsilon=1.0,
                     dp_noise_multiplier=1.0)


def test_the_experiment_reads_each_victims_own_mechanism_and_resumes_finished_cells(tmp_path, capsys):
    """Full batch (rate 1): each game's bound is Φ(Φ⁻¹(1/k) + √T/σ) at the victim's own recorded σ and steps."""
    import json

    from scipy.stats import norm

    out = tmp_path / "exp"
    args = ["experiment", "dp", "--settings", "paper", "--seeds", "0", "-n", "10", "--epochs", "4", "--epsilons", "10",
            "--iterations", "10", "--targets", "2", "--no-progress", "-o", str(out)]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["level"] for p in result["points"]] == ["none", "clip", "10"] and (out / "dp.png").is_file()
    row = next(r for r in json.loads((out / "dp.json").read_text())["rows"] if r["level"] == "10")
    for k in (2, 8, 100):
        want = norm.cdf(norm.ppf(1 / k) + math.sqrt(row["steps"]) / row["noise_multiplier"])
        assert row["steps"] == 4 and row[f"bound_game_{k}"]["value"] == pytest.approx(want, abs=1e-12)
    assert "| paper | 10 |" in (out / "dp.md").read_text() and "chance_at_or_below_epsilon" in result["findings"]["paper"]["game_8"]
    rows = sorted((out / "cells").glob("*/row.json"))
    stamps = [r.stat().st_mtime_ns for r in rows]
    assert main([*args, "--resume"]) == 0 and [r.stat().st_mtime_ns for r in rows] == stamps


def test_the_dp_budget_is_one_setting_of_the_audit_config_for_flags_toml_and_python(tmp_path):
    from exhume.audit.command import settings
    from exhume.audit.config import from_options
    from exhume.cli import build_parser

    (tmp_path / "audit.toml").write_text('model = "m.py:Net"\nweights = "w.pt"\ntrain = "t.npz"\nunseen = "u.npz"\n'
                                         'normalize = "none"\nloss = "logistic"\nweight_decay = 0\ndp_epsilon = 8\n')
    args = build_parser().parse_args(["audit", "--config", str(tmp_path / "audit.toml"), "--dp-delta", "1e-6"])
    cfg = settings(args)
    assert (cfg.dp_epsilon, cfg.dp_delta) == (8.0, 1e-6)
    assert from_options(loss="logistic", weight_decay=0, normalize="none", dp_epsilon=3).dp_delta == 1e-5
    for bad, line in (({"dp_epsilon": -1}, "dp_epsilon: expected a number > 0"), ({"dp_epsilon": 1, "dp_delta": 1.0},
                      "dp_delta: expected a number < 1"), ({"dp_steps": 10}, "dp_steps describe a DP budget: give dp_epsilon")):
        with pytest.raises(ConfigError, match=line):
            from_options(loss="logistic", weight_decay=0, normalize="none", **bad)
