"""TLDR (paper 004): convnet victims, the conditioned generator, the inversion and tldr attacks,
their loss terms on hand-made inputs, and the train-vs-held-out evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.generative.generator import CONDITIONINGS, ConditionedGenerator, hot_matrix, sample_conditioning
from exhume.attacks.generative.inversion import FeatureTap
from exhume.attacks.generative.losses import ce_term, cosine_term, grad_norm_term, kl_term, ortho_term, perturb, pixel_term, tv_term
from exhume.errors import ConfigError
from exhume.evaluation.trainlike import class_grid, per_class_evaluation
from exhume.evaluation.trainlike_stats import membership_tests, nearer_train_test, signal_separation, victim_signals
from exhume.models import build_model, parse_arch
from exhume.victim import AttackerView, MiniBatchConfig, load_victim, make_minibatch_victim, train_minibatch

torch.set_num_threads(1)


# -- a toy classifier: three classes of 8×8 images, a bright bar in the top, middle or bottom rows --

def toy_data(n_per_class: int = 60, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(3):
        x = 0.1 * torch.rand(n_per_class, 1, 8, 8, generator=g)
        rows = slice(3 * c, 3 * c + 2)
        x[:, :, rows, :] += 0.8
        xs.append(x)
        ys.append(torch.full((n_per_class,), c))
    return torch.cat(xs), torch.cat(ys)


@pytest.fixture(scope="module")
def toy_view():
    torch.manual_seed(0)
    x, y = toy_data()
    mean = x.mean(0)
    model = build_model("convnet:6;fc=16;dropout=0.1", (1, 8, 8), 3)
    metrics = train_minibatch(model, x - mean, y, MiniBatchConfig(epochs=15, batch_size=30, lr=1e-2), progress=False)
    assert metrics["train_accuracy"] == 1.0
    return AttackerView(model=model, task="multiclass", input_shape=(1, 8, 8), mean=mean, loss="cross-entropy", num_classes=3)


# -- conditioning ------------------------------------------------------------------------------

def test_conditioning_encodes_the_hidden_label():
    g = torch.Generator().manual_seed(1)
    labels = torch.tensor([0, 1, 2, 2, 4])
    for kind in CONDITIONINGS:
        c = sample_conditioning(kind, 5, 5, g, labels=labels)
        assert torch.equal(c.labels, labels)
        assert torch.equal(c.target.argmax(1), labels)
        assert torch.allclose(c.target.sum(1), torch.ones(5))
        if kind in ("vector", "vector-matrix"):
            assert torch.equal(c.vector.argmax(1), labels) and (c.vector < 1).all()  # soft, not one-hot
        if kind in ("matrix", "vector-matrix"):
            m = c.matrix[3, 0]
            assert m[2].sum() == 5 and m[:, 2].sum() == 5 and m.sum() == 9  # row and column 2, nothing else
    hot = sample_conditioning("vector-matrix", 5, 5, g, hot=True, labels=labels)
    assert torch.equal(hot.vector, F.one_hot(labels, 5).float())
    assert torch.equal(hot_matrix(torch.tensor([0]), 3)[0, 0], torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 0, 0]]))


@pytest.mark.parametrize("kind", CONDITIONINGS)
def test_each_conditioning_inverts_a_trained_toy_classifier(toy_view, kind):
    attack = get_attack("inversion", conditioning=kind, steps=400, batch_size=30, width=8, latent_dim=8, lr=1e-2,
                        samples_per_class=10)
    rec = attack.run(toy_view, seed=0, progress=False)
    assert rec.candidates.shape == (30, 1, 8, 8)
    assert torch.equal(rec.labels, torch.arange(3).repeat_interleave(10))
    with torch.no_grad():
        pred = toy_view.model(rec.candidates - toy_view.mean).argmax(1)
    for c in range(3):
        assert (pred[rec.labels == c] == c).float().mean() >= 0.9, (kind, c, pred)
    assert rec.summary["classifier_accuracy_per_class"] == pytest.approx(
        [float((pred[rec.labels == c] == c).float().mean()) for c in range(3)], abs=0.11)


def test_tldr_runs_resumes_and_reports_its_terms(toy_view, tmp_path):
    kw = dict(batch_size=12, width=8, latent_dim=8, samples_per_class=2)
    every = dict(checkpoint_every=2, log_every=1)
    first = get_attack("tldr", steps=3, **kw).run(toy_view, out=tmp_path, seed=0, progress=False, **every)
    assert first.summary["iterations"] == 3
    more = get_attack("tldr", steps=5, **kw).run(toy_view, out=tmp_path, seed=0, progress=False, resume=True, **every)
    assert more.summary["iterations"] == 5
    assert [h["iteration"] for h in more.loss_history] == [1, 2, 3, 4, 5]
    assert {"kl", "ce", "cosine", "ortho", "kl_pert", "ce_pert", "tv", "pixel", "grad"} <= set(more.loss_history[-1])
    assert (tmp_path / "generator.safetensors").is_file()
    with pytest.raises(Exception, match="cannot resume"):
        get_attack("tldr", steps=5, **{**kw, "eps": 0.2}).run(toy_view, out=tmp_path, seed=0, progress=False, resume=True, **every)


# -- generator output size ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 8, 8), (3, 20, 36)])
@pytest.mark.parametrize("kind", ["label", "vector-matrix"])
def test_generator_output_fits_the_victim(shape, kind):
    gen = ConditionedGenerator(shape, 10, kind, latent_dim=8, width=8)
    x, cond = gen.sample(3, torch.Generator().manual_seed(0))
    assert tuple(x.shape) == (3, *shape)
    if min(shape[1:]) >= 8:
        victim = build_model("convnet:4,4;fc=8", shape, 10).eval()
        assert victim(x).shape == (3, 10)


# -- loss terms on hand-made inputs ------------------------------------------------------------

def test_kl_and_cross_entropy_terms():
    p = torch.tensor([[0.7, 0.2, 0.1]])
    assert kl_term(p, p.log()).item() == pytest.approx(0.0, abs=1e-6)
    assert kl_term(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2)).item() == pytest.approx(math.log(2))  # 0·log 0 = 0
    assert ce_term(torch.tensor([3]), torch.zeros(1, 4)).item() == pytest.approx(math.log(4))


def test_cosine_and_orthogonality_terms():
    eye = torch.eye(4)
    assert cosine_term(eye).item() == pytest.approx(0.0)
    assert ortho_term(eye).item() == pytest.approx(0.0)
    assert ortho_term(eye, normalize=False).item() == pytest.approx(0.0)
    same = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    assert cosine_term(same).item() == pytest.approx(1.0)
    assert cosine_term(torch.tensor([[1.0, 0.0], [-3.0, 0.0]])).item() == pytest.approx(-1.0)
    assert ortho_term(same).item() == pytest.approx(0.5)  # G = [[1,1],[1,1]]: two off-diagonal ones / 4
    assert ortho_term(2 * eye[:2], normalize=False).item() == pytest.approx(2 * 9 / 4)  # G = 4I: (4−1)² twice / 4


def test_total_variation_and_pixel_terms():
    assert tv_term(torch.full((2, 3, 5, 5), 0.3)).item() == 0.0
    stripes = torch.zeros(1, 1, 4, 4)
    stripes[..., 1::2] = 1.0  # columns 0,1,0,1: 3 horizontal jumps per row, 4 rows
    assert tv_term(stripes).item() == pytest.approx(12.0)
    assert tv_term(torch.cat([stripes, torch.zeros_like(stripes)])).item() == pytest.approx(6.0)  # mean over images
    img = torch.tensor([-0.5, 1.5, 0.5, 1.0]).reshape(1, 1, 2, 2)
    assert pixel_term(img).item() == pytest.approx(1.0)
    assert pixel_term(torch.rand(3, 1, 4, 4)).item() == 0.0


def test_gradient_norm_term():
    lin = nn.Linear(2, 2)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in lin.named_parameters()}
    x, y = torch.tensor([[1.0, -1.0], [0.5, 2.0]], requires_grad=True), torch.tensor([0, 1])
    batch = grad_norm_term(lin, params, {}, x, y, "batch")
    loss = F.cross_entropy(lin(x), y)
    ref = torch.sqrt(sum((g ** 2).sum() for g in torch.autograd.grad(loss, list(lin.parameters()))))
    assert batch.item() == pytest.approx(ref.item(), rel=1e-5)
    per = grad_norm_term(lin, params, {}, x, y, "per-sample")
    refs = [torch.sqrt(sum((g ** 2).sum() for g in torch.autograd.grad(F.cross_entropy(lin(x[i:i + 1]), y[i:i + 1]), list(lin.parameters()))))
            for i in range(2)]
    assert per.item() == pytest.approx(float(sum(refs) / 2), rel=1e-5)
    (gx,) = torch.autograd.grad(per, x)  # differentiable with respect to the images
    assert torch.isfinite(gx).all() and gx.abs().sum() > 0
    # at a (numerical) minimum of the loss the gradient vanishes: a saturated, correct prediction
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[40.0, 0.0], [-40.0, 0.0]]))
        lin.bias.zero_()
    params = {n: p.detach().clone().requires_grad_(True) for n, p in lin.named_parameters()}
    xs = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    for mode in ("batch", "per-sample"):
        assert grad_norm_term(lin, params, {}, xs, torch.tensor([0, 1]), mode).item() < 1e-6
        assert grad_norm_term(lin, params, {}, xs, torch.tensor([1, 0]), mode).item() > 1.0  # wrong labels: large


def test_perturbation_is_linf_bounded_and_adversarial():
    lin = nn.Linear(4, 2)
    x = torch.rand(5, 4)
    y = lin(x).argmax(1)
    pert = perturb(x, y, lin, 0.1, "fgsm")
    assert (pert - x).abs().max().item() == pytest.approx(0.1)
    assert F.cross_entropy(lin(pert), y) > F.cross_entropy(lin(x), y)
    rnd = perturb(x, y, lin, 0.1, "random", torch.Generator().manual_seed(0))
    assert torch.allclose((rnd - x).abs(), torch.full_like(x, 0.1))


def test_feature_tap_reads_the_last_hidden_layer():
    model = build_model("convnet:4;fc=7", (1, 8, 8), 3).eval()
    tap = FeatureTap(model)
    model(torch.rand(2, 1, 8, 8))
    assert tap.layer == "head" and tap.value.shape == (2, 7)
    tap.remove()
    named = FeatureTap(model, "features")
    model(torch.rand(2, 1, 8, 8))
    assert named.value.shape == (2, 4 * 4 * 4)


# -- victims -------------------------------------------------------------------------------------

def test_convnet_victim_save_load_round_trip(tmp_path):
    v = make_minibatch_victim("mnist", "multiclass", 100, "convnet:4,8;fc=16;dropout=0.2",
                              MiniBatchConfig(epochs=1, batch_size=20), seed=0, test_size=50, progress=False)
    assert v.arch["type"] == "convnet" and v.train_config["trainer"] == "minibatch"
    assert not v.model.training
    w = load_victim(v.save(tmp_path / "victim"))
    sd, sw = v.model.state_dict(), w.model.state_dict()
    assert "features.1.running_mean" in sw and sw["features.1.running_mean"].abs().sum() > 0  # BN statistics travel
    assert all(torch.equal(sd[k], sw[k]) for k in sd)
    x = torch.rand(4, 1, 28, 28)
    assert torch.equal(v.model(x), w.model(x))  # eval mode: deterministic
    assert w.train_set.x.shape == (100, 1, 28, 28)


def test_per_class_evaluation_prefers_the_training_set():
    g = torch.Generator().manual_seed(0)
    train = torch.rand(20, 1, 16, 16, generator=g)
    held = torch.rand(20, 1, 16, 16, generator=g)
    ty = hy = torch.arange(20) % 2
    cands = (train[:6] + 0.02 * torch.randn(6, 1, 16, 16, generator=g)).clamp(0, 1)  # near-copies of training images
    ev = per_class_evaluation(cands, ty[:6], train, ty, held, hy)
    assert ev["frac_nearer_train_ssim"] == 1.0 and ev["frac_nearer_train_l2"] == 1.0
    assert ev["ssim_to_train_mean"] > 0.9 > ev["ssim_to_heldout_mean"]
    assert ev["train_one_to_one_ssim>=0.4"] == 6 and ev["held_one_to_one_ssim>=0.4"] == 0
    assert [r["class"] for r in ev["per_class"]] == [0, 1]


def test_membership_test_on_hand_made_distances():
    # 40 candidates, 30 nearer a training image: significant (binomial p = P[Bin(40, 1/2) >= 30] = 0.00111)
    d_train = torch.tensor([1.0] * 30 + [3.0] * 10)
    d_held = torch.full((40,), 2.0)
    sig = nearer_train_test(d_train, d_held)
    assert sig["nearer_train"] == 30 and sig["ties"] == 0 and abs(sig["binomial_p"] - 0.0011) < 1e-4
    assert sig["permutation_p"] < 0.01
    # 21 of 40 (ties dropped) is what chance gives: not significant; and similarities count the other way
    null = nearer_train_test([1.0] * 21 + [3.0] * 19 + [2.0] * 5, [2.0] * 45)
    assert null["ties"] == 5 and null["binomial_p"] > 0.3 and null["permutation_p"] > 0.2
    flipped = nearer_train_test(d_train, d_held, higher_is_nearer=True)  # as similarities: higher is nearer
    assert flipped["nearer_train"] == 10 and flipped["binomial_p"] > 0.99
    with pytest.raises(Exception, match="equal-length"):
        nearer_train_test([1.0, 2.0], [1.0])


def test_membership_tests_on_images_equalise_the_sets_and_detect_near_copies():
    g = torch.Generator().manual_seed(0)
    train, held = torch.rand(30, 1, 12, 12, generator=g), torch.rand(40, 1, 12, 12, generator=g)
    ty, hy = torch.arange(30) % 3, torch.arange(40) % 3
    copies = (train[:24] + 0.05 * torch.randn(24, 1, 12, 12, generator=g)).clamp(0, 1)
    hit = membership_tests(copies, ty[:24], train, ty, held, hy)
    assert hit["l2"]["binomial_p"] < 1e-6 and hit["ssim"]["binomial_p"] < 1e-6
    fresh = torch.rand(24, 1, 12, 12, generator=g)  # candidates that know nothing of the training set
    miss = membership_tests(fresh, ty[:24], train, ty, held, hy)
    assert miss["l2"]["binomial_p"] > 0.01 and miss["ssim"]["binomial_p"] > 0.01


def test_victim_signals_and_their_separation(toy_view):
    x, y = toy_data(20, seed=5)
    sig = victim_signals(toy_view.model, x - toy_view.mean, y, eps=0.05)
    assert {k: v.shape for k, v in sig.items()} == {k: (60,) for k in ("confidence", "grad_norm", "fgsm_confidence")}
    assert (sig["confidence"] > 0.5).all() and (sig["fgsm_confidence"] <= sig["confidence"] + 1e-6).all()
    # hand-made: training images more confident, smaller gradients -> AUC near 1; identical -> 0.5
    rng = torch.Generator().manual_seed(1)
    a = {"confidence": torch.rand(50, generator=rng).numpy() + 1, "grad_norm": torch.rand(50, generator=rng).numpy(),
         "fgsm_confidence": torch.rand(50, generator=rng).numpy()}
    b = {"confidence": torch.rand(50, generator=rng).numpy(), "grad_norm": torch.rand(50, generator=rng).numpy() + 1,
         "fgsm_confidence": a["fgsm_confidence"].copy()}
    sep = signal_separation(a, b)
    assert sep["confidence"]["auc"] == 1.0 and sep["grad_norm"]["auc"] == 1.0 and sep["confidence"]["mannwhitney_p"] < 1e-10
    assert sep["fgsm_confidence"]["auc"] == 0.5 and sep["fgsm_confidence"]["mannwhitney_p"] > 0.4


def test_class_grid_writes_a_png(tmp_path):
    path = class_grid(torch.rand(6, 1, 8, 8), torch.tensor([0, 0, 1, 1, 2, 2]), tmp_path / "g.png", per_class=3)
    assert path.stat().st_size > 0


# -- bad arguments ----------------------------------------------------------------------------------

def test_bad_arguments_are_refused(toy_view):
    with pytest.raises(ConfigError, match="conditioning"):
        get_attack("inversion", conditioning="hidden")
    with pytest.raises(ConfigError, match="eps"):
        get_attack("tldr", eps=-0.1)
    with pytest.raises(ConfigError, match="grad_mode"):
        get_attack("tldr", grad_mode="sometimes")
    with pytest.raises(ConfigError, match="batch_size"):
        get_attack("tldr", batch_size=1)
    with pytest.raises(ConfigError, match="eta_tv"):
        get_attack("inversion", eta_tv=1.0)  # a reconstruction-only weight
    with pytest.raises(ConfigError, match="feature_layer"):
        get_attack("inversion", feature_layer="nope", steps=1).run(toy_view, progress=False)
    binary = AttackerView(model=nn.Linear(64, 1), task="binary", input_shape=(1, 8, 8), mean=torch.zeros(1, 8, 8))
    with pytest.raises(ConfigError, match="multiclass"):
        get_attack("tldr", steps=1).run(binary, progress=False)
    with pytest.raises(ConfigError, match="widths"):
        parse_arch("convnet:a,b")
    with pytest.raises(ConfigError, match="unknown convnet option"):
        parse_arch("convnet:8;pool=avg")
    with pytest.raises(ConfigError, match="dropout"):
        build_model("convnet:8;dropout=1.5", (1, 28, 28), 10)
    with pytest.raises(ConfigError, match="too small"):
        build_model("convnet:4,4,4,4", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="optimizer"):
        MiniBatchConfig(optimizer="gd")
    with pytest.raises(ConfigError, match="batch_size"):
        MiniBatchConfig(batch_size=0)
    with pytest.raises(ConfigError, match="output shape"):
        ConditionedGenerator((28, 28), 10)


def test_experiment_is_registered_and_checks_sizes():
    from exhume.experiments import get_experiment
    from exhume.experiments.tldr import _parse_sizes

    text = get_experiment("tldr").help  # its CPU default in sizes and steps; the time measured is in docs/defaults.md
    assert "300 generator steps" in text and " min" not in text
    assert _parse_sizes("1000, 2000") == [1000, 2000]
    with pytest.raises(ConfigError, match="sizes"):
        _parse_sizes("1k,2k")


def test_generator_attacks_refuse_an_init_by_name():
    import exhume

    view = AttackerView(model=build_model("convnet:4;fc=7", (1, 8, 8), 3).eval(), task="multiclass", input_shape=(1, 8, 8),
                        mean=torch.zeros(1, 8, 8), num_classes=3)
    with pytest.raises(ConfigError, match="'inversion' attack draws its candidates from a generator and takes no init"):
        exhume.attack(view, "inversion", init=torch.rand(3, 1, 8, 8), progress=False)
