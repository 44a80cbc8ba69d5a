"""The training inputs' span read from the first layer (exhume.attacks.kkt.subspace) and kkt's projection onto it."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.engine.base import attack_model
from exhume.attacks.kkt.subspace import data_subspace, input_layer
from exhume.data.datasets import load_bundled_mnist
from exhume.equations.span import MIN_DENOISE_SHARE, learned_part, noise_edge
from exhume.equations.stationarity import least_squares, per_candidate_gradients
from exhume.errors import ConfigError
from exhume.losses import margin
from exhume.models import build_model
from exhume.victim import AttackerView, TrainConfig, train_victim

N = 12


@functools.cache
def _digits():
    """12 bundled MNIST training digits (two of each of six classes, odd against even) and 20 others."""
    ds = load_bundled_mnist()
    rng = np.random.default_rng(0)
    pick = np.concatenate([rng.choice(np.flatnonzero(ds.labels == c), 2, replace=False) for c in range(6)])
    rest = np.setdiff1d(np.arange(len(ds)), pick)[rng.choice(len(ds) - N, 20, replace=False)]
    x = torch.from_numpy(ds.images[pick])
    y = torch.from_numpy(np.where(ds.labels[pick] % 2 == 1, 1.0, -1.0)).float()
    return x, y, torch.from_numpy(ds.images[rest])


def _trained(arch: str, weight_decay: float, epochs: int) -> tuple[nn.Module, torch.Tensor]:
    """A 784-input MLP of ``arch`` trained by full-batch GD on the 12 centred digits, and their mean."""
    x, y, _ = _digits()
    mean = x.mean(0)
    torch.manual_seed(0)
    model = build_model(arch, (1, 28, 28), 1)
    train_victim(model, x - mean, y, TrainConfig(lr=0.2, weight_decay=weight_decay, max_epochs=epochs), progress=False)
    return model, mean


@functools.cache
def _victim():
    """A bias-free 784-64-64-1 MLP from a small first-layer init, trained with weight decay on the 12 digits."""
    model, mean = _trained("mlp:64,64;bias=none;init=1e-4", 5e-3, 2000)
    return AttackerView(model=model, task="binary", input_shape=(1, 28, 28), mean=mean, loss="logistic",
                        weight_decay=5e-3, n_train_hint=N)


def _outside(points: torch.Tensor, basis: torch.Tensor) -> float:
    """Share of the points' squared norm outside the span of ``basis``."""
    p = points.reshape(points.shape[0], -1).double()
    b = basis.double()
    r = p - p @ b @ b.T
    return float((r ** 2).sum() / (p ** 2).sum())


def test_the_first_layer_of_a_trained_mlp_shows_the_span_of_its_training_digits():
    view = _victim()
    x, _, unseen = _digits()
    model, params = attack_model(view.model, "cpu", torch.float32)
    span = data_subspace(model, params, (1, 28, 28), N)
    # 12 centred digits span 11 directions: 11 singular values stand above the initialisation's noise
    assert span.info["subspace_used"] == "above-noise" and span.info["subspace_rank"] == N - 1
    assert _outside(x - view.mean, span.basis) < 0.01
    # the span is theirs: unseen digits lie mostly outside it
    assert _outside(unseen - view.mean, span.basis) > 0.5


class SquaredInput(nn.Module):
    """A linear layer on the squared input: its weight has the input's width but the input does not enter linearly."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x ** 2))).squeeze(-1)


class TwoPaths(nn.Module):
    """Two 6-wide weights; only the second is the map the input enters through."""

    def __init__(self) -> None:
        super().__init__()
        self.decoy = nn.Parameter(torch.randn(3, 6))
        self.a = nn.Linear(6, 4, bias=False)
        self.b = nn.Linear(4, 1, bias=False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).squeeze(-1) + (self.decoy ** 2).sum()


def test_the_input_layer_is_found_by_the_gradients_algebra_not_by_the_module_structure():
    torch.manual_seed(0)
    mlp = build_model("mlp:8;bias=all", (1, 3, 2), 1)
    assert input_layer(mlp, dict(mlp.named_parameters()), (1, 3, 2)) == "net.0.weight"
    two = TwoPaths()
    assert input_layer(two, dict(two.named_parameters()), (6,)) == "a.weight"
    sq = SquaredInput()
    assert input_layer(sq, dict(sq.named_parameters()), (6,)) is None
    cnn = build_model("cnn:4;fc=8;pool=avg", (1, 8, 8), 1)
    assert input_layer(cnn, dict(cnn.named_parameters()), (1, 8, 8)) is None


def test_the_noise_edge_counts_the_directions_above_a_random_initialisation():
    g = torch.Generator().manual_seed(0)
    h, d, k = 200, 500, 25
    u = torch.linalg.qr(torch.randn(h, k, generator=g))[0]
    v = torch.linalg.qr(torch.randn(d, k, generator=g))[0]
    w = 1e-3 * torch.randn(h, d, generator=g) + u @ torch.diag(torch.linspace(0.5, 0.1, k)) @ v.T
    lin = nn.Linear(d, h, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    params = dict(lin.named_parameters())
    span = data_subspace(lin, params, (d,), n_guess=60)
    assert span.info["subspace_used"] == "above-noise" and span.info["subspace_rank"] == k
    # the noise edge of a 200 x 500 matrix of N(0, 1e-3²) entries is about 1e-3 (√200 + √500) = 0.036
    assert span.info["subspace_cut_by"] == "initialisation"
    assert span.info["subspace_cut"] == pytest.approx(1.1 * 1e-3 * (200 ** 0.5 + 500 ** 0.5), rel=0.1)
    assert _outside(v.T, span.basis) < 0.02  # the weakest directions (0.1) tilt by the noise (0.036) a little
    # pure noise: nothing above the edge, so no subspace
    with torch.no_grad():
        lin.weight.copy_(1e-3 * torch.randn(h, d, generator=g))
    none = data_subspace(lin, dict(lin.named_parameters()), (d,), n_guess=60)
    assert none.basis is None and "initialisation still holds" in none.info["subspace_reason"]
    # where the data could fill every direction the edge is not estimated
    assert noise_edge(torch.linalg.svdvals(w), (h, d), n_guess=h) is None


def test_a_first_layer_still_dominated_by_its_initialisation_shows_no_span():
    """PyTorch's default initialisation: the noise holds most of the layer, the data's directions are buried."""
    model, _ = _trained("mlp:64,64;bias=all", 1e-3, 300)
    span = data_subspace(model, dict(model.named_parameters()), (1, 28, 28), N)
    assert span.basis is None and span.info["subspace_noise_share"] > 0.5
    assert "initialisation still holds" in span.info["subspace_reason"]
    # the small-init victim's share is tiny
    view = _victim()
    small = data_subspace(view.model, dict(view.model.named_parameters()), (1, 28, 28), N)
    assert small.info["subspace_noise_share"] < 1e-2


def test_below_float32_precision_nothing_counts_as_data_and_a_full_spectrum_has_no_span():
    g = torch.Generator().manual_seed(1)
    h, d, k = 100, 300, 10
    u = torch.linalg.qr(torch.randn(h, k + 1, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(d, k + 1, generator=g, dtype=torch.float64))[0]
    # ten strong directions, one at 1e-7 of the largest (below float32's floor of 10 ε = 1.2e-6), tiny noise
    strengths = torch.cat([torch.linspace(1.0, 0.1, k), torch.tensor([1e-7])]).double()
    w = u @ torch.diag(strengths) @ v.T + 1e-12 * torch.randn(h, d, generator=g, dtype=torch.float64)
    lin = nn.Linear(d, h, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(w)
    params = dict(lin.named_parameters())
    as_float32 = data_subspace(lin, params, (d,), n_guess=20, precision=torch.float32)
    assert as_float32.info["subspace_rank"] == k and as_float32.info["subspace_cut_by"] == "precision"
    as_float64 = data_subspace(lin, params, (d,), n_guess=20)
    assert as_float64.info["subspace_rank"] == k + 1 and as_float64.info["subspace_cut_by"] == "initialisation"
    # as many training points as singular values: the data may fill them all, no span
    full = data_subspace(lin, params, (d,), n_guess=h)
    assert full.basis is None and "may fill all 100 directions" in full.info["subspace_reason"]


def test_kkt_with_the_subspace_keeps_its_candidates_in_the_span_and_finds_the_digits_closer():
    view = _victim()
    x, _, _ = _digits()
    kw = dict(iterations=400, m=2 * N, background=0)  # the raw iterate: the dark floor leaves the span
    plain = get_attack("kkt", subspace="off", **kw).run(view, progress=False, seed=0, log_every=100)
    proj = get_attack("kkt", **kw).run(view, progress=False, seed=0, log_every=100)  # subspace="auto", the default
    assert plain.config["subspace"] == "off" and "subspace_used" not in plain.config
    assert proj.config["subspace"] == "auto" and proj.config["subspace_used"] == "above-noise"
    assert proj.config["subspace_rank"] == N - 1
    model, params = attack_model(view.model, "cpu", torch.float32)
    basis = data_subspace(model, params, (1, 28, 28), N).basis
    assert _outside(proj.candidates - view.mean, basis) < 1e-6
    assert _outside(plain.candidates - view.mean, basis) > 1e-3

    def nearest(recon):  # each training digit's distance to its nearest candidate (or its negative)
        return torch.cdist(x.flatten(1), recon.candidates.flatten(1)).min(1).values.mean()

    assert nearest(proj) < nearest(plain)


def test_kkt_with_the_subspace_on_a_cnn_runs_without_one_and_says_why():
    torch.manual_seed(0)
    model = build_model("cnn:4;fc=8;pool=avg", (1, 8, 8), 1)
    view = AttackerView(model=model, task="binary", input_shape=(1, 8, 8), mean=torch.zeros(1, 8, 8), n_train_hint=4)
    recon = get_attack("kkt", iterations=20).run(view, progress=False)
    assert recon.config["subspace_used"] == "none" and "linear map" in recon.config["subspace_reason"]


@pytest.mark.parametrize("name", ["subspace", "denoise"])
@pytest.mark.parametrize("value", ["on", True, None])
def test_bad_subspace_and_denoise_values_are_refused(name, value):
    with pytest.raises(ConfigError, match=f"{name} must"):
        get_attack("kkt", **{name: value})


def test_a_float64_attack_reads_the_span_at_the_victims_float32_precision():
    view = _victim()
    f32 = get_attack("kkt", iterations=2).run(view, progress=False)
    f64 = get_attack("kkt", iterations=2, dtype="float64").run(view, progress=False)
    assert f64.config["subspace_rank"] == f32.config["subspace_rank"] == N - 1
    assert f64.config["subspace_cut"] == pytest.approx(f32.config["subspace_cut"], rel=1e-4)


def test_the_learned_part_drops_an_initialisations_bulk_and_keeps_the_directions_above_it():
    g = torch.Generator().manual_seed(2)
    h, d, k = 120, 150, 3
    u = torch.linalg.qr(torch.randn(h, k, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
    signal = u @ torch.diag(torch.tensor([6.0, 4.0, 3.0], dtype=torch.float64)) @ v.T
    noise = 0.05 * torch.randn(h, d, generator=g, dtype=torch.float64)  # edge ≈ 0.05 (√120 + √150) = 1.16, share ≈ 0.42
    vec = torch.randn(h, generator=g, dtype=torch.float64)
    target, info = learned_part({"w": signal + noise, "b": vec}, n_guess=10)
    assert info["denoise_used"] == "above-noise" and info["denoise_layers"]["w"]["rank_kept"] == k
    assert info["denoise_layers"]["w"]["noise_share"] == pytest.approx(0.42, abs=0.05)
    # the noise is gone but for its part along the kept directions, about 0.05·√(k(h+d)) = 1.4 of its 6.7
    assert float((target["w"] - signal).norm()) < 0.3 * float(noise.norm())
    assert torch.equal(target["b"], vec)  # vectors are not matrices with a bulk: kept as they are
    # a matrix whose noise is below MIN_DENOISE_SHARE of it, or whose smaller side the data could fill, stays
    quiet = signal + 1e-3 * torch.randn(h, d, generator=g, dtype=torch.float64)
    assert learned_part({"w": quiet}, n_guess=10) == (None, {"denoise_used": "none", "denoise_reason":
                                                            f"no weight tensor's initialisation noise holds {MIN_DENOISE_SHARE:.0%} or more of it"})
    assert learned_part({"w": signal + noise}, n_guess=h)[0] is None
    # an untrained network: nothing above the noise anywhere, so nothing is replaced (no equation would be left)
    target, info = learned_part({"w": noise, "v": 0.05 * torch.randn(h, h, generator=g, dtype=torch.float64)}, n_guess=10)
    assert target is None and "nothing learned" in info["denoise_reason"]
    assert info["denoise_layers"]["w"]["rank_kept"] == info["denoise_layers"]["v"]["rank_kept"] == 0


@functools.cache
def _no_decay_victim():
    """784-64-64-1 bias-free, first layer from 1e-4, the middle one at PyTorch's default init, no weight decay (Haim's regime)."""
    model, mean = _trained("mlp:64,64;bias=none;init=1e-4", 0.0, 400)
    return AttackerView(model=model, task="binary", input_shape=(1, 28, 28), mean=mean, loss="logistic",
                        weight_decay=0.0, n_train_hint=N)


def _explained_share(model, params, x, y, theta) -> float:
    """``1 − min_{λ ≥ 0} ‖θ' − Σ_i λ_i ∇_θ margin_i‖² / ‖θ'‖²``: the share of ``θ'`` (``theta``) the points explain (float64)."""
    J = per_candidate_gradients(model, params, x, y, margin).double()
    t = torch.cat([theta[k].reshape(-1) for k in params]).double()
    rest = t - J.T @ least_squares(J, t, nonnegative=True, ridge=1e-10)
    return float(1.0 - (rest @ rest) / (t @ t))


def test_without_weight_decay_the_training_points_explain_the_learned_part_not_the_initialisation():
    """Evaluator-side check of learned_part's premise: the 12 digits' gradients explain W − W₀'s estimate, not W₀."""
    view = _no_decay_victim()
    x, y, _ = _digits()
    params = {k: p.detach() for k, p in view.model.named_parameters()}
    target, info = learned_part(params, N)
    assert list(info["denoise_layers"]) == ["net.2.weight"]  # the small-init first layer and the output vector stay
    assert info["denoise_layers"]["net.2.weight"]["noise_share"] > 0.7
    raw = _explained_share(view.model, params, x - view.mean, y, params)
    learned = _explained_share(view.model, params, x - view.mean, y, target)
    assert raw < 0.5 and learned > 0.85  # measured: 0.39 and 0.91


def test_kkt_with_denoise_explains_the_learned_part():
    view = _no_decay_victim()
    kw = dict(iterations=200, m=2 * N)
    plain = get_attack("kkt", denoise="off", **kw).run(view, progress=False, seed=0)
    dn = get_attack("kkt", **kw).run(view, progress=False, seed=0)  # denoise="auto", the default
    assert "denoise_used" not in plain.config and dn.config["denoise"] == "auto" and dn.config["denoise_used"] == "above-noise"
    assert 0.2 < dn.config["denoise_theta_share"] < 0.7
    assert dn.config["lambda_scale_value"] == plain.config["lambda_scale_value"]  # S = ‖θ‖²/(L·n·q₀) of all of θ, as before
    # the equation is solvable once the initialisation's bulk is out of it
    assert dn.summary["final_relative_stationarity"] < 0.7 * plain.summary["final_relative_stationarity"]
    # a victim without a matrix the estimate applies to (every smaller side ≤ n_guess) is attacked exactly as without denoise
    torch.manual_seed(0)
    small = AttackerView(model=build_model("cnn:4;fc=8;pool=avg", (1, 8, 8), 1), task="binary", input_shape=(1, 8, 8),
                         mean=torch.zeros(1, 8, 8), n_train_hint=16)
    same = [get_attack("kkt", iterations=20, denoise=dv).run(small, progress=False, seed=1) for dv in ("off", "auto")]
    assert torch.equal(same[0].candidates, same[1].candidates) and same[1].config["denoise_used"] == "none"


def test_the_span_rule_is_one_function_whose_constants_are_declared_once_and_the_stage_one_predicate():
    """kkt's first layer, the feature stage, the layer report and the informed read all read the span through span_of (the
    stage through subspace.as_subspace); the rule's constants are assigned in exhume/equations/span.py alone, and neither reader of kkt
    decomposes a weight itself."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    constants = {"SPAN_GAP", "MAX_NOISE_SHARE", "EDGE_MARGIN", "FLOOR_EPS"}
    assigned, calls = set(), {}
    for path in (root / "exhume").rglob("*.py"):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assigned |= {(rel, t.id) for t in targets if isinstance(t, ast.Name) and t.id in constants}
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                calls.setdefault(name, set()).add(rel)
    assert {rel for rel, _ in assigned} == {"exhume/equations/span.py"} and {c for _, c in assigned} == constants
    # the informed adversary's read asks the same rule whether the first layer off the known records is rank one
    assert calls["span_of"] == {"exhume/attacks/kkt/subspace.py", "exhume/equations/span.py", "exhume/attacks/kkt/read.py"}
    assert calls["as_subspace"] == {"exhume/attacks/kkt/subspace.py", "exhume/attacks/kkt/stage.py"}
    decomposes = calls.get("svdvals", set()) | calls.get("svd", set())
    assert not decomposes & {"exhume/attacks/kkt/subspace.py", "exhume/attacks/kkt/stage.py"}
    # and one predicate takes the feature stage: layer_above is asked in KKTAttack.stage_on alone
    attack = ast.parse((root / "exhume/attacks/kkt/attack.py").read_text())
    askers = {f.name for f in ast.walk(attack) if isinstance(f, ast.FunctionDef)
              for c in ast.walk(f) if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "layer_above"}
    assert calls["layer_above"] == {"exhume/attacks/kkt/attack.py"} and askers == {"stage_on"}
