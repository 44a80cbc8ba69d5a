"""The known start: the equation of training that stopped early (exact on cases with a known answer), and the attack
(the start's files and the training settings: test_start_files.py)."""

from __future__ import annotations

import pytest
import torch
from _start_cases import Tiny, forgotten, state
from _start_cases import fine_tuned as _fine_tuned
from safetensors.torch import save_file
from torch import nn

from exhume.equations.trajectory import build_equation
from exhume.errors import ConfigError, ExhumeError
from exhume.evaluation.residuals import explained
from exhume.losses import margin
from exhume.victim import AttackerView


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(6, 1)

    def forward(self, x):
        return self.w(x.flatten(1)).squeeze(-1)


# -- the equation on cases with a known answer ---------------------------------------------------
def _trained(model: nn.Module, x, y, steps: int, lr: float, wd: float):
    """Full-batch gradient descent on the logistic loss with PyTorch's SGD (weight decay in the gradient)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x)).mean().backward()
        opt.step()
    return model


def _case(model, steps: int, equation: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(5, 6, generator=gen, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1], dtype=torch.float64)
    start = state(model)
    lr, wd = 0.3, 1e-2
    _trained(model, x, y, steps, lr, wd)
    view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=start,
                        training={"optimizer": "sgd", "lr": lr, "weight_decay": wd, "steps": steps})
    params = {k: v.detach() for k, v in model.named_parameters()}
    eq = build_equation(view, model, params, equation, 5)
    unseen = torch.rand(5, 6, generator=gen, dtype=torch.float64)
    return eq, explained(model, eq, x, y, margin), explained(model, eq, unseen, y, margin)


def test_a_linear_model_s_trajectory_equation_holds_exactly_with_its_training_points():
    torch.manual_seed(0)
    eq, train, unseen = _case(Lin().double(), 30, "trajectory")
    assert eq.info["start_decay_rule"] == "from the training settings"
    assert train["relative_residual"] < 1e-12 < 1e-3 < unseen["relative_residual"]


def test_one_step_of_a_network_is_explained_exactly_by_gradients_at_the_start():
    torch.manual_seed(0)
    _, train, unseen = _case(Tiny().double(), 1, "endpoints")
    assert train["relative_residual"] < 1e-12 < 1e-3 < unseen["relative_residual"]


def test_the_evaluator_s_residual_of_the_known_start_equation_is_zero_at_the_training_points():
    from exhume.evaluation.residuals import known_start_residual

    torch.manual_seed(0)
    model = Tiny().double()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(5, 6, generator=gen, dtype=torch.float64), torch.tensor([1.0, -1, 1, -1, 1], dtype=torch.float64)
    start = state(model)
    _trained(model, x, y, 1, 0.3, 1e-2)
    view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=start,
                        training={"optimizer": "sgd", "lr": 0.3, "weight_decay": 1e-2, "steps": 1})
    got = known_start_residual(view, x, y)
    assert got["value"] < 1e-12 and abs(got["decay"] - (1 - 0.3 * 1e-2)) < 1e-15 and "λ ≥ 0" in got["definition"]
    assert known_start_residual(view, torch.rand(5, 6, generator=gen, dtype=torch.float64), y)["value"] > 1e-3


def test_the_fitted_decay_is_the_optimiser_s():
    torch.manual_seed(0)
    model = Lin().double()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(5, 6, generator=gen, dtype=torch.float64), torch.tensor([1.0, -1, 1, -1, 1], dtype=torch.float64)
    start = state(model)
    _trained(model, x, y, 30, 0.3, 1e-2)
    view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=start)
    params = {k: v.detach() for k, v in model.named_parameters()}
    fit = explained(model, build_equation(view, model, params, "trajectory", 5, decay="fit"), x, y, margin)
    assert abs(fit["decay_fitted"] - (1 - 0.3 * 1e-2) ** 30) < 1e-9


def test_equations_that_need_a_start_refuse_a_view_without_one():
    model = Tiny()
    view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6))
    with pytest.raises(ConfigError, match="starting weights"):
        build_equation(view, model, {k: v.detach() for k, v in model.named_parameters()}, "endpoints", 5)
    from exhume.attacks import get_attack

    with pytest.raises(ExhumeError, match="needs the starting weights"):
        get_attack("kkt", start_equation="endpoints", iterations=1).run(view, progress=False)


# -- the attack ----------------------------------------------------------------------------------
def _view(model, start=None, **kw):
    return AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5), loss="logistic",
                        weight_decay=1e-3, n_train_hint=4, start=start, **kw)


def _distances(recon, x) -> torch.Tensor:
    c, t = recon.candidates.reshape(len(recon.candidates), -1), x.reshape(len(x), -1)
    return (torch.cdist(t, c) / t.norm(dim=1, keepdim=True)).min(1).values


def test_a_tiny_fine_tuned_victim_is_recovered_with_its_start_and_not_without():
    from exhume.attacks import get_attack

    model, start, x = _fine_tuned()
    with_start = get_attack("kkt", iterations=500).run(_view(model, start), progress=False)
    weights_only = get_attack("kkt", iterations=500).run(_view(model), progress=False)
    assert with_start.config["equation_used"] == "endpoints" and with_start.config["threat_model"] == "the attacker knows the starting weights"
    assert weights_only.config["threat_model"] == "weights only"
    assert _distances(with_start, x).max() < 0.15 < 0.25 < _distances(weights_only, x).min()


def test_resume_with_another_start_is_refused(tmp_path):
    import exhume
    from exhume.files.runfolder import RunFolderError

    model, start, _ = _fine_tuned()
    other = {k: v + 0.01 for k, v in start.items()}
    exhume.attack(_view(model), restarts=1, out=tmp_path / "one", iterations=4, checkpoint_every=2, progress=False, start=start)
    with pytest.raises(ExhumeError, match="start") as e:
        exhume.attack(_view(model), restarts=1, out=tmp_path / "one", iterations=8, progress=False, resume=True, start=other)
    assert "\n" not in str(e.value)
    exhume.attack(_view(model), restarts=2, workers=1, out=tmp_path / "two", iterations=3, progress=False, start=start)
    with pytest.raises(RunFolderError, match="another starting point"):
        exhume.attack(_view(model), restarts=2, workers=1, out=tmp_path / "two", iterations=3, progress=False, resume=True,
                      start=other)


def test_the_portfolio_s_restarts_get_the_start(tmp_path):
    import exhume

    model, start, _ = _fine_tuned()
    recon = exhume.attack(_view(model), restarts=2, workers=1, iterations=3, progress=False, start=start,
                          training={"optimizer": "sgd", "lr": 0.1, "weight_decay": 1e-3, "steps": 50})
    rows = recon.config["portfolio"]["restarts"]
    assert len(rows) == 2 and recon.config["equation_used"] == "endpoints"
    assert recon.config["threat_model"] == "the attacker knows the starting weights"
    assert recon.config["start_decay_rule"] == "from the training settings"


@pytest.mark.parametrize("kwargs, message", [
    ({"start_equation": "trajectory-ish"}, "start_equation"), ({"start_decay": -0.5}, "start_decay"), ({"start_decay": "fitted"}, "start_decay"),
    ({"preconditioner": "diagonal"}, "preconditioner"),
])
def test_bad_known_start_arguments_are_refused_by_name(kwargs, message):
    from exhume.attacks import get_attack

    with pytest.raises(ConfigError, match=message):
        get_attack("kkt", **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"preconditioner": "state"}, "second moment"),
])
def test_known_start_settings_that_do_not_fit_the_view_are_refused(kwargs, message):
    from exhume.attacks import get_attack

    model, start, _ = _fine_tuned()
    with pytest.raises(ConfigError, match=message):
        get_attack("kkt", iterations=1, **kwargs).run(_view(model, start), progress=False)


def test_the_cli_reads_the_start_file_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    from exhume.cli import main
    from exhume.victim import TrainConfig, make_victim

    torch.manual_seed(0)
    cfg = TrainConfig(loss="logistic", optimizer="gd", lr=0.2, weight_decay=5e-3, max_epochs=5, max_seconds=10)
    victim = make_victim("mnist", "odd-even", 10, "mlp:16;init=1e-3", cfg, seed=0, progress=False, test_size=20)
    victim.save(tmp_path / "v")
    start = {k: v + 0.01 for k, v in victim.model.state_dict().items()}
    save_file(start, str(tmp_path / "start.safetensors"))
    base = ["attack", str(tmp_path / "v"), "--no-progress", "--restarts", "1", "--iterations", "2"]
    assert main([*base, "-o", str(tmp_path / "r"), "--start-weights", str(tmp_path / "start.safetensors"),
                 "--train-optimizer", "sgd", "--train-lr", "0.2", "--train-steps", "5"]) == 0
    import json

    meta = json.loads((tmp_path / "r" / "reconstruction.json").read_text())
    assert meta["config"]["threat_model"] == "the attacker knows the starting weights"
    save_file({**start, "extra.weight": torch.zeros(2)}, str(tmp_path / "bad.safetensors"))
    capsys.readouterr()
    assert main([*base, "-o", str(tmp_path / "r2"), "--start-weights", str(tmp_path / "bad.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'extra.weight'" in err and len(err.splitlines()) == 1
    assert main([*base, "-o", str(tmp_path / "r3"), "--train-lr", "0.1"]) == 2
    assert "--start-weights" in capsys.readouterr().err


def test_adam_s_second_moment_preconditions_only_while_the_start_survives():
    torch.manual_seed(0)
    model = Tiny()
    start = state(model)
    moment = {k: torch.rand_like(v) for k, v in model.named_parameters()}
    params = {k: v.detach() for k, v in model.named_parameters()}

    def rule(scale: float) -> str:
        with torch.no_grad():
            for k, v in model.named_parameters():
                v.copy_(scale * start[k] + 0.01)
        view = AttackerView(model=model, task="binary", input_shape=(6,), mean=torch.zeros(6), start=start,
                            training={"optimizer": "adam", "second_moment": moment})
        return build_equation(view, model, params, "trajectory", 5).info["preconditioner"]

    assert rule(0.9).startswith("adam second moment")
    assert rule(0.05).startswith("none: only 0.05 of the start survives")


def test_the_span_is_read_from_what_training_added_to_the_input_layer():
    """After SGD from a known start, W_T − c·W_0 has exactly the training inputs' row space (c fitted by the nuclear norm)."""
    from exhume.attacks.kkt.subspace import data_subspace
    from exhume.equations.trajectory import added_inputs_layer, nuclear_decay

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0)).double()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(3, 10, generator=gen, dtype=torch.float64) - 0.5, torch.tensor([1.0, -1, 1], dtype=torch.float64)
    start = state(model)
    _trained(model, x, y, 40, 0.3, 2e-2)
    c = (1 - 0.3 * 2e-2) ** 40
    assert abs(nuclear_decay(model[1].weight.detach(), start["1.weight"]) - c) < 1e-3
    view = AttackerView(model=model, task="binary", input_shape=(10,), mean=torch.zeros(10), start=start)
    params = {k: v.detach() for k, v in model.named_parameters()}
    eq = build_equation(view, model, params, "trajectory", 3, decay="fit")
    added, info = added_inputs_layer(eq, params, start, 10)
    span = data_subspace(model, added, (10,), 3, precision=torch.float64)
    assert span.info["subspace_rank"] == 3 and abs(info["subspace_start_decay[1.weight]"] - c) < 1e-3
    assert float((span.project(x) - x).norm() / x.norm()) < 1e-4


def test_a_frozen_input_layer_gives_no_span():
    """Its weights show what it was pre-trained on, not this training set: no projection."""
    from exhume.attacks import get_attack

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    with torch.no_grad():  # a low-rank first layer: the weights alone would show a 3-dimensional span
        model[1].weight.copy_(torch.randn(32, 3) @ torch.randn(3, 16))
    start = state(model)
    with torch.no_grad():
        model[3].weight.add_(0.1)
    recon = get_attack("kkt", iterations=1, subspace="auto").run(_view(model, start), progress=False)
    assert recon.config["subspace_used"] == "none" and "frozen at its start" in recon.config["subspace_reason"]
    assert recon.config["start_frozen_parameters"] == ["1.bias", "1.weight", "3.bias"]


def test_the_set_up_checks_run_once_for_a_probe_and_its_restarts_and_again_when_the_victim_changes(monkeypatch):
    """The checks read from the weights at set-up (which layer the input enters through, the homogeneity degree: float64
    gradients of the whole model, seconds on a wide one) are remembered for the victim: a sizing probe and the restarts
    of one portfolio pay for them once, the reconstruction the same to the bit as with the checks run every time; a
    victim changed in place, or given other tensors, is checked again."""
    from exhume.attacks import get_attack
    from exhume.attacks.kkt import subspace
    from exhume.equations import formulation, workcopy
    from exhume.portfolio import run_portfolio

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    start = state(model)
    with torch.no_grad():
        model[3].weight.add_(0.1)
    view = AttackerView(model=model, task="binary", input_shape=(1, 4, 4), mean=torch.full((1, 4, 4), 0.5), loss="logistic",
                        weight_decay=0.0, n_train_hint=4, start=start)  # no weight decay: the degree is recorded
    layers, degrees = [], []
    real_layer, real_degree = subspace.input_layer, formulation.homogeneity_degree
    monkeypatch.setattr(subspace, "input_layer", lambda *a, **k: layers.append(1) or real_layer(*a, **k))
    monkeypatch.setattr(formulation, "homogeneity_degree", lambda *a, **k: degrees.append(1) or real_degree(*a, **k))
    r = run_portfolio(view, max_seconds=2.0, workers=1, progress=False, iterations=5)
    assert "sizing" in r.config["portfolio"] and r.summary["restarts"] >= 1 and len(layers) == len(degrees) == 1
    once = get_attack("kkt", iterations=5).run(view, progress=False)
    assert len(layers) == len(degrees) == 1
    workcopy._FACTS.clear()
    again = get_attack("kkt", iterations=5).run(view, progress=False)
    assert torch.equal(again.candidates, once.candidates) and again.config == once.config and len(layers) == 2
    with torch.no_grad():
        model[1].weight.mul_(1.0)  # in place: a new version of the tensor
    get_attack("kkt", iterations=1).run(view, progress=False)
    model[3].bias = nn.Parameter(model[3].bias.detach().clone())  # another tensor
    get_attack("kkt", iterations=1).run(view, progress=False)
    assert len(layers) == len(degrees) == 4


def test_with_a_start_the_candidates_default_to_one_per_point_unless_given():
    from exhume.attacks import get_attack

    model, start, _ = _fine_tuned()
    assert get_attack("kkt", iterations=1).run(_view(model, start), progress=False).candidates.shape[0] == 4
    assert get_attack("kkt", iterations=1, candidates_per_point=2.0).run(_view(model, start), progress=False).candidates.shape[0] == 8
    assert get_attack("kkt", iterations=1).run(_view(model), progress=False).candidates.shape[0] == 8


def test_a_start_that_training_forgot_is_left_out_and_the_stationary_equation_solved():
    """Adam with strong weight decay: 7 % of the start left, so 'auto' solves what weights only would, to the bit, and says
    why; a start that survives, or one with a frozen parameter, keeps the known-start equation."""
    from exhume.attacks import get_attack
    from exhume.attacks.kkt import equation_for
    from exhume.equations.trajectory import start_survival

    model, start, _ = forgotten()
    assert start_survival({k: v.detach() for k, v in model.named_parameters()}, start, list(start)) < 0.1
    with_start = get_attack("kkt", iterations=20).run(_view(model, start), progress=False)
    weights_only = get_attack("kkt", iterations=20).run(_view(model), progress=False)
    assert with_start.config["equation_used"] == "stationary"
    assert with_start.config["threat_model"] == "the attacker knows the starting weights"
    assert "training forgot it" in with_start.config["start_unused"] and "start_unused" not in weights_only.config
    assert torch.equal(with_start.candidates, weights_only.candidates) and with_start.candidates.shape[0] == 8
    one_frozen = {**start, "1.weight": model[1].weight.detach().clone()}
    assert equation_for("auto", _view(model, one_frozen)) == "endpoints"
    assert equation_for("auto", _view(*_fine_tuned()[:2])) == "endpoints"


def test_a_start_for_an_attack_that_ignores_it_is_refused():
    import exhume

    model, start, _ = _fine_tuned()
    with pytest.raises(ConfigError, match="'tldr' attack does not use the starting weights; attacks that do: kkt, simulate"):
        exhume.attack(_view(model), method="tldr", restarts=1, start=start, progress=False)
