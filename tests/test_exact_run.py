"""The exact training run: torch.optim's update rules and a DataLoader's order replayed (equal to a real plain-PyTorch
run), the equation that holds with no slack at the training images, the recipe refused in one line per bad setting,
and the simulate attack's exact run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from exhume.attacks import get_attack
from exhume.attacks.engine.record import parse_record
from exhume.equations.kinds import ExactRun
from exhume.equations.recipe import batches
from exhume.errors import ConfigError
from exhume.evaluation.assumptions import checks_for
from exhume.evaluation.residuals import exact_run_residual as exact_residual
from exhume.victim import AttackerView
from exhume.victim.start import TrainingSettings

N, BATCH, EPOCHS, SEED = 8, 3, 3, 5
TORCH = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
         "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
         "nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-2),
         "adam": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.8, 0.99), weight_decay=1e-3),
         "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2)}
RECIPES = {"sgd": {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0},
           "sgd-momentum": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
           "nesterov": {"optimizer": "sgd", "lr": 0.1, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-2},
           "adam": {"optimizer": "adam", "lr": 1e-2, "betas": (0.8, 0.99), "weight_decay": 1e-3},
           "adamw": {"optimizer": "adamw", "lr": 1e-2, "weight_decay": 1e-2}}


def _victim(kind: str = "sgd-momentum", classes: int = 1, hidden: int = 32):
    """A 16-32-k ReLU MLP (float64) trained by a plain PyTorch loop: one shuffled DataLoader with a seeded generator,
    iterated for 3 epochs of batches of 3 (the last batch of each epoch holds 2)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, classes)).double()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(N, 1, 4, 4, generator=gen, dtype=torch.float64) - 0.5
    y = torch.arange(N) % max(2, classes)
    opt = TORCH[kind](model.parameters())
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    for _ in range(EPOCHS):
        for xb, yb in loader:
            opt.zero_grad()
            out = model(xb)
            loss = (nn.functional.binary_cross_entropy_with_logits(out[:, 0], yb.double()) if classes == 1
                    else nn.functional.cross_entropy(out, yb))
            loss.backward()
            opt.step()
    head = nn.Flatten(0) if classes == 1 else nn.Identity()
    model = nn.Sequential(*model, head)  # exhume's binary convention: one logit per input
    training = {**RECIPES[kind], "batch_size": BATCH, "epochs": EPOCHS, "sampler": "random", "seed": SEED}
    view = AttackerView(model=model, task="binary" if classes == 1 else "multiclass", input_shape=(1, 4, 4),
                        mean=torch.full((1, 4, 4), 0.5), start=start, training=training,
                        num_classes=None if classes == 1 else classes, n_train_hint=N)
    return view, x, (2.0 * y - 1 if classes == 1 else y)


def test_the_order_is_the_dataloader_s():
    s = TrainingSettings(batch_size=BATCH, epochs=EPOCHS, sampler="random", seed=SEED)
    loader = DataLoader(TensorDataset(torch.arange(N)), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    drawn = [b[0] for _ in range(EPOCHS) for b in loader]
    assert len(batches(s, N)) == len(drawn) == EPOCHS * 3
    assert all(torch.equal(a, b) for a, b in zip(batches(s, N), drawn))
    assert not torch.equal(drawn[0], drawn[3])  # each epoch draws a new permutation
    assert [b.tolist() for b in batches(dataclasses.replace(s, sampler="sequential", seed=None), N)[:3]] == [[0, 1, 2], [3, 4, 5], [6, 7]]


@pytest.mark.parametrize("kind", sorted(RECIPES))
def test_the_replay_equals_torch_optim_on_a_real_run(kind):
    view, x, y = _victim(kind)
    assert exact_residual(view, x, y)["value"] <= 1e-12  # float64: the same run to rounding


def test_the_equation_has_no_slack_at_the_training_images_and_refuses_others():
    view, x, y = _victim("sgd-momentum", classes=3)
    eq = get_attack("simulate").equation_on(view)
    assert isinstance(eq, ExactRun)
    checks = checks_for(eq)
    truth = checks.residual(view.model, x, y, "cross-entropy", 0.0)
    assert truth["value"] <= 1e-6 and checks.residual_failures(truth) == []
    other = torch.rand(x.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64) - 0.5
    wrong = checks.residual(view.model, other, y, "cross-entropy", 0.0)
    assert wrong["value"] > 1e-2 and "does not reproduce the weights" in checks.residual_failures(wrong)[0]
    reseeded = dataclasses.replace(view, training=dataclasses.replace(view.training, seed=SEED + 1))
    assert checks_for(ExactRun(view=reseeded)).residual(view.model, x, y, "cross-entropy", 0.0)["value"] > 1e-2  # another shuffle order


GOOD = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3, "batch_size": BATCH, "epochs": EPOCHS,
        "sampler": "random", "seed": SEED}


@pytest.mark.parametrize("change, message", [
    ({"optimizer": None}, "needs training setting optimizer"),
    ({"lr": None}, "needs training setting lr"),
    ({"weight_decay": None}, "needs training setting weight_decay"),
    ({"batch_size": None}, "needs training setting batch_size"),
    ({"epochs": None}, "needs training setting epochs"),
    ({"sampler": None}, "needs training setting sampler"),
    ({"seed": None}, "training setting seed is missing"),
    ({"sampler": "sequential"}, "seed is inconsistent with sampler 'sequential'"),
    ({"betas": (0.9, 0.99)}, "betas is inconsistent with optimizer 'sgd'"),
    ({"eps": 1e-6}, "eps is inconsistent with optimizer 'sgd'"),
    ({"optimizer": "adam"}, "momentum is inconsistent with optimizer 'adam'"),
    ({"batch_size": N + 1}, f"batch_size {N + 1} is larger than the {N} training points"),
    ({"steps": 10}, "steps 10 is inconsistent with epochs 3"),
    ({"momentum": None, "nesterov": True}, "nesterov needs a momentum"),
    ({"optimizer": "adam", "momentum": None, "adam_step": 4}, "adam_step 4 is inconsistent with the run's 9 steps"),
])
def test_a_missing_or_inconsistent_recipe_is_refused_naming_the_setting(change, message):
    view, _, _ = _victim()
    recipe = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    bad = dataclasses.replace(view, training=TrainingSettings(**recipe))
    with pytest.raises(ConfigError, match=message) as e:
        get_attack("simulate").check(bad)
    assert "\n" not in str(e.value)


def test_settings_the_replay_cannot_honour_are_refused():
    view, _, _ = _victim()
    with pytest.raises(ConfigError, match="training setting sampler must be one of random, sequential"):
        TrainingSettings(sampler="weighted")
    normed = nn.Sequential(nn.Flatten(), nn.Linear(16, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1), nn.Flatten(0)).double()
    start = {k: v.detach() + 0.01 for k, v in normed.named_parameters()}
    with pytest.raises(ConfigError, match="BatchNorm1d layers, which train on batch statistics"):
        get_attack("simulate").check(dataclasses.replace(view, model=normed, start=start))


def test_the_attack_replays_the_recipe_and_descends_on_its_gap():
    view, _, _ = _victim()
    attack = get_attack("simulate", iterations=8, dtype="float64", init_scale=0.1, prior_weight=0.0)
    recon = attack.run(view, progress=False, log_every=1)
    gaps = [h["unexplained"] for h in recon.loss_history]
    assert gaps[-1] < 0.7 * gaps[0]  # measured: 1.14 -> 0.58 in 8 steps (seeded)
    assert recon.candidates.shape == (N, 1, 4, 4) and recon.config["equation_used"] == "the exact training run"
    assert recon.config["recipe"]["seed"] == SEED and "betas" not in recon.config["recipe"] and recon.config["replayed_steps"] == 9
    assert recon.summary["final_relative_stationarity"] == pytest.approx(gaps[-1], rel=0.5)


def test_the_exact_run_identifies_the_training_images_where_the_attack_does_not_reach_them():
    from exhume.evaluation.identifiability import identifiability

    view, x, y = _victim()
    attack = get_attack("simulate", iterations=3, dtype="float64", init_scale=0.1)
    recon = attack.run(view, progress=False)
    eq = attack.equation_on(view)
    record = identifiability(eq, view.model, x, y, "logistic", checks_for(eq).residual(view.model, x, y, "logistic", 0.0), recon)
    assert record["residual_at_training"] <= 1e-12 and record["attack_best_residual"] > 0.1
    assert record["admits_other_images"] is False and record["attack_to_truth"] > 1e6


def _train_binary(model: nn.Module, opt, x: torch.Tensor, y: torch.Tensor, batch_size: int, epochs: int) -> None:
    """A plain PyTorch loop: the logistic loss over a shuffled DataLoader seeded with ``SEED``, ``epochs`` times."""
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(xb)[:, 0], yb.to(x.dtype)).backward()
            opt.step()


def _tiny(seed: int = 0, optimizer: str = "sgd"):
    """A 8-16-1 ReLU MLP (float64) trained by a plain PyTorch loop on 4 points (2×4 pixels), batches of 2 from a seeded
    shuffled DataLoader, 3 epochs: 6 steps of SGD with momentum 0.9 (or Adam), 4 × 8 = 32 unknowns against 161 parameters."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.rand(4, 1, 2, 4, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) - 0.5
    y = (torch.arange(4) % 2)[torch.randperm(4, generator=torch.Generator().manual_seed(seed + 2))]
    recipe = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9} if optimizer == "sgd" else {"optimizer": optimizer, "lr": 1e-2}
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-2))
    _train_binary(model, opt, x, y, batch_size=2, epochs=3)
    view = AttackerView(model=nn.Sequential(*model, nn.Flatten(0)), task="binary", input_shape=(1, 2, 4),
                        mean=torch.full((1, 2, 4), 0.5), start=start, n_train_hint=4,
                        training={**recipe, "weight_decay": 0.0, "batch_size": 2, "epochs": 3, "sampler": "random", "seed": SEED})
    return view, x, y


def test_the_functional_replay_and_its_jacobian_equal_the_checkpointed_replay():
    from torch.func import jacfwd

    from exhume.attacks.replay.lm import run_flat
    from exhume.equations.exact import make_replay, replay

    view, x, y = _tiny()
    model, params = view.model, dict(view.model.named_parameters())
    params = {k: v.detach() for k, v in params.items()}
    q = y.double()
    for alpha in (None, 3.0):
        r = make_replay(model, params, view.start, view.training, 4, "binary", alpha=alpha)
        xx = x.clone().requires_grad_()
        slow = replay(r, xx, q)
        flat = torch.cat([slow[k].reshape(-1) for k in r.names])
        assert torch.allclose(run_flat(r, x, q), flat.detach(), rtol=0, atol=1e-13)
        v = torch.randn(flat.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        back = torch.autograd.grad(flat @ v, xx)[0].reshape(-1)
        jac = jacfwd(lambda z, r=r: run_flat(r, z.reshape(x.shape), q))(x.reshape(-1))
        assert torch.allclose(v @ jac, back, rtol=1e-10, atol=1e-12)  # forward mode = the attack's backward, α and all


def test_levenberg_marquardt_recovers_every_training_image_of_a_tiny_relu_victim_from_noise():
    from scipy.optimize import linear_sum_assignment

    view, x, y = _tiny()
    labels = ",".join(str(int(v)) for v in y)  # given, in the training set's order: an assumption of this threat model
    attack = get_attack("simulate", solver="lm", labels=labels, iterations=80, dtype="float64", init_scale=0.1)
    recon = attack.run(view, progress=False, log_every=1)
    got = recon.candidates.double().flatten(1) - 0.5
    truth = x.flatten(1)
    unseen = torch.rand(4, 8, generator=torch.Generator().manual_seed(99), dtype=torch.float64) - 0.5
    rel = torch.cdist(got, truth) / truth.norm(dim=1)
    rows, cols = linear_sum_assignment(rel.numpy())
    assert sorted(cols.tolist()) == [0, 1, 2, 3] and rel[rows, cols].max() < 1e-4  # measured: 1e-12, 37 iterations
    assert (torch.cdist(got, unseen) / unseen.norm(dim=1)).min() > 0.3  # far from images it was not trained on
    assert recon.summary["final_relative_stationarity"] < 1e-16 and recon.summary["iterations"] < 80
    assert recon.labels.tolist() == [1.0 if v else -1.0 for v in y.tolist()]


def test_the_lm_solver_s_settings_are_refused_in_one_line():
    view, _, _ = _tiny()
    for kwargs, message in [({"labels": "1,0"}, "labels must list 4 class ids"),
                            ({"labels": "a,b"}, "labels must be 'fixed' or 4"),
                            ({"solver": "lm", "schedule": "3,-1"}, "schedule must be positive")]:
        with pytest.raises(ConfigError, match=message) as e:
            get_attack("simulate", **kwargs).check(view)
        assert "\n" not in str(e.value)


def _adam_victim():
    """A 64-32-1 ReLU MLP (float32) trained with Adam by a plain PyTorch loop: 32 images of 8×8 with a blank border, 5
    epochs of batches of 8 (20 steps)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    x[:, :, 0, :] = x[:, :, :, 0] = 0
    y = torch.arange(32) % 2
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _train_binary(model, opt, x, y, batch_size=8, epochs=5)
    return AttackerView(model=nn.Sequential(*model, nn.Flatten(0)), task="binary", input_shape=(1, 8, 8),
                        mean=torch.zeros(1, 8, 8), start=start, n_train_hint=32,
                        training={"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "batch_size": 8, "epochs": 5,
                                  "sampler": "random", "seed": SEED})


def test_an_adam_run_overflows_float32_from_candidates_at_the_mean_and_not_from_data_scale():
    from exhume.errors import DivergenceError

    view = _adam_victim()
    with pytest.raises(DivergenceError, match="raise init_scale to 0.1 or more, or dtype='float64'"):
        get_attack("simulate", iterations=2).run(view, progress=False)  # init_scale 1.7e-3: gradient ~1e49
    recon = get_attack("simulate", iterations=3, init_scale=0.1).run(view, progress=False, log_every=1)
    gaps = [h["unexplained"] for h in recon.loss_history]
    assert all(map(math.isfinite, gaps)) and gaps[-1] < gaps[0] and bool(torch.isfinite(recon.candidates).all())


def test_the_coarse_simulation_s_settings_are_retired_and_an_old_exact_checkpoint_resumes(tmp_path):
    """The coarse simulation's settings are refused by name (removed), at any value; a checkpoint written with them at
    what an exact run recorded, and with the step sizes ρ, resumes; one of the coarse run is refused, naming it."""
    from exhume.files.torchfile import load_torch, save_torch

    view, _, _ = _victim()
    for kwargs in ({"run": "coarse"}, {"run": "exact"}, {"m": 16}, {"tv_weight": 1e-4}):
        with pytest.raises(ConfigError, match=f"has no parameter\\(s\\) {next(iter(kwargs))};.*removed") as e:
            get_attack("simulate", **kwargs)
        assert "\n" not in str(e.value)
    settings, every = {"iterations": 2, "dtype": "float64", "init_scale": 0.1}, {"checkpoint_every": 1, "log_every": 1}
    get_attack("simulate", **settings).run(view, out=tmp_path, progress=False, **every)
    ckpt = tmp_path / "checkpoint.pt"
    old = load_torch(ckpt, "test", "checkpoint")
    old["state"]["config"].update(run="exact", steps=4, lr_rates=1e-2, step_scale=1.0, m=None, candidates_per_point=1.0,
                                  start_decay="auto", preconditioner="auto", subspace="auto")
    old["tensors"]["rho"] = torch.zeros(0, dtype=torch.float64)
    old["state"]["history"][0]["loss"] = -1.0  # a mark: a resumed run carries the saved history on
    save_torch(ckpt, old)
    recon = get_attack("simulate", **{**settings, "iterations": 3}).run(view, out=tmp_path, resume=True, progress=False, **every)
    assert [h["iteration"] for h in recon.loss_history] == [1, 2, 3] and recon.loss_history[0]["loss"] == -1.0
    old["state"]["config"]["run"] = "coarse"
    save_torch(ckpt, old)
    with pytest.raises(Exception, match="run='coarse' there"):
        get_attack("simulate", **{**settings, "iterations": 4}).run(view, out=tmp_path, resume=True, progress=False, **every)


def test_the_attack_needs_a_start_and_checkpoints_its_digest(tmp_path):
    from exhume.errors import ExhumeError

    view, _, _ = _victim()
    with pytest.raises(ConfigError, match="starting weights"):
        get_attack("simulate", iterations=1).run(dataclasses.replace(view, start=None), progress=False)
    recon = get_attack("simulate", iterations=2).run(view, out=tmp_path, progress=False, checkpoint_every=1)
    assert recon.candidates.shape == (N, 1, 4, 4) and recon.config["threat_model"] == "the attacker knows the starting weights"
    moved = dataclasses.replace(view, start={k: v + 0.01 for k, v in view.start.items()})
    with pytest.raises(ExhumeError, match="start"):
        get_attack("simulate", iterations=3).run(moved, out=tmp_path, resume=True, progress=False)


@pytest.mark.parametrize("kwargs, message", [({"solver": "gauss"}, "solver"), ({"segment": 0}, "segment"),
                                             ({"background": 0.9}, "background"), ({"alpha": -1.0}, "alpha")])
def test_bad_simulate_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        get_attack("simulate", **kwargs)


def test_a_run_folder_of_the_removed_coarse_simulation_still_loads_and_evaluates(tmp_path):
    import exhume
    from exhume.attacks import Reconstruction, load_reconstruction
    from exhume.equations.kinds import KnownStart
    from exhume.evaluation.assumptions import equation_of

    gen = torch.Generator().manual_seed(0)
    train, unseen = torch.rand(4, 1, 4, 4, generator=gen), torch.rand(40, 1, 4, 4, generator=gen)
    old = Reconstruction("simulate", train + 0.01, torch.ones(4), None, parse_record(
        {"run": "coarse", "steps": 4, "step_scale": 1.0, "m": None, "equation_used": "simulated training",
         "threat_model": "the attacker knows the starting weights"}, {"iterations": 10, "final_relative_stationarity": 0.2, "step_sizes": [0.1] * 4}), 0)
    recon = load_reconstruction(old.save(tmp_path / "old"))
    assert isinstance(equation_of(recon.method, recon=recon), KnownStart)  # judged by the endpoints equation, as it was
    scores = exhume.evaluate(recon, train=(train, torch.ones(4)), unseen=unseen, figures=False)
    assert scores.metrics["memorised"] == 4
