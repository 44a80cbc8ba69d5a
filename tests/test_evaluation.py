"""Tests for exhume.evaluation: SSIM, matching, the memorisation count, metrics files, plots."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from skimage import metrics as skimage_metrics  # a test dependency (pyproject.toml [test])

from exhume.errors import ConfigError, DataError
from exhume.evaluation import (
    best_match,
    candidates_grid,
    evaluate_images,
    l2_matrix,
    match,
    ncc_matrix,
    one_to_one,
    pairs_grid,
    plot_sorted_ssim,
    plot_ssim_vs_margin,
    ssim_matrix,
    ssim_pairs,
    support_estimate,
    window_description,
    window_for,
)

MNIST = Path(__file__).resolve().parents[1] / "exhume" / "data" / "mnist_subset.npz"


@pytest.fixture(scope="module")
def mnist() -> torch.Tensor:
    with np.load(MNIST) as d:
        # the file is sorted by label: take a fixed random subset covering all ten digits
        idx = np.random.default_rng(0).permutation(d["images"].shape[0])[:400]
        imgs = d["images"][idx].astype(np.float64) / 255.0
        labels = d["labels"][idx]
    x = torch.from_numpy(imgs).unsqueeze(1)             # (400, 1, 28, 28) in [0, 1]
    x.labels = labels                                   # kept on the tensor for the tests
    return x


def sk_ssim(x: torch.Tensor, y: torch.Tensor) -> float:
    """scikit-image's SSIM with the contract's settings; x, y: (C, H, W)."""
    x, y = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    kw = dict(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1.0)
    if x.shape[0] == 1:
        return float(skimage_metrics.structural_similarity(x[0], y[0], **kw))
    return float(skimage_metrics.structural_similarity(x, y, channel_axis=0, **kw))


def blobs(n: int, c: int, size: int, seed: int) -> torch.Tensor:
    """Real-looking images: blurred random blobs, rescaled to [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, c, size, size))
    for i in range(n):
        base = gaussian_filter(rng.random((size, size)), 3)
        for ch in range(c):
            img = gaussian_filter(0.6 * base + 0.4 * rng.random((size, size)), 1.5 + ch)
            out[i, ch] = (img - img.min()) / (img.max() - img.min())
    return torch.from_numpy(out)


# ---------------------------------------------------------------- SSIM

@pytest.mark.parametrize("kind", ["mnist", "random", "blobs"])
def test_ssim_gray_matches_skimage(kind, mnist):
    g = torch.Generator().manual_seed(0)
    if kind == "mnist":
        a, b = mnist[:6], mnist[6:12]
    elif kind == "random":
        a, b = torch.rand(6, 1, 28, 28, generator=g, dtype=torch.float64), \
            torch.rand(6, 1, 28, 28, generator=g, dtype=torch.float64)
    else:
        a, b = blobs(6, 1, 28, 1), blobs(6, 1, 28, 2)
    ref = np.array([sk_ssim(a[i], b[i]) for i in range(6)])
    np.testing.assert_allclose(ssim_pairs(a, b).numpy(), ref, atol=1e-4)
    mat = ssim_matrix(a, b).numpy()
    np.testing.assert_allclose(np.diag(mat), ref, atol=1e-4)
    assert abs(mat[1, 4] - sk_ssim(a[1], b[4])) < 1e-4


@pytest.mark.parametrize("kind", ["random", "blobs"])
def test_ssim_rgb_matches_skimage(kind):
    if kind == "random":
        g = torch.Generator().manual_seed(1)
        a = torch.rand(5, 3, 32, 32, generator=g, dtype=torch.float64)
        b = (0.5 * a + 0.5 * torch.rand(5, 3, 32, 32, generator=g, dtype=torch.float64))
    else:
        a, b = blobs(5, 3, 32, 3), blobs(5, 3, 32, 4)
        b[0] = (a[0] + 0.05 * torch.randn(3, 32, 32, dtype=torch.float64)).clamp(0, 1)
    ref = np.array([sk_ssim(a[i], b[i]) for i in range(5)])
    np.testing.assert_allclose(ssim_pairs(a, b).numpy(), ref, atol=1e-4)
    np.testing.assert_allclose(np.diag(ssim_matrix(a, b).numpy()), ref, atol=1e-4)


def test_matrix_equals_pairs(mnist):
    a, b = mnist[:20], mnist[20:70]
    mat = ssim_matrix(a, b, batch=128)                      # several chunks in both directions
    ii, jj = torch.meshgrid(torch.arange(20), torch.arange(50), indexing="ij")
    pairs = ssim_pairs(a[ii.flatten()], b[jj.flatten()]).reshape(20, 50)
    assert (mat - pairs).abs().max() < 1e-5
    # float64 working precision and other batch sizes give the same numbers
    assert (ssim_matrix(a, b, dtype=torch.float64) - pairs).abs().max() < 1e-10
    assert (ssim_matrix(a, b, batch=37) - mat).abs().max() < 1e-6
    rgb_a, rgb_b = blobs(4, 3, 32, 5).float(), blobs(7, 3, 32, 6).float()
    ii, jj = torch.meshgrid(torch.arange(4), torch.arange(7), indexing="ij")
    pairs = ssim_pairs(rgb_a[ii.flatten()], rgb_b[jj.flatten()]).reshape(4, 7)
    assert (ssim_matrix(rgb_a, rgb_b) - pairs).abs().max() < 1e-5


def test_identical_images_score_one(mnist):
    x = torch.cat([mnist[:5], torch.full((1, 1, 28, 28), 0.3, dtype=torch.float64)])
    assert torch.allclose(ssim_pairs(x, x), torch.ones(6, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(ssim_matrix(x, x).diagonal(), torch.ones(6, dtype=torch.float64),
                          atol=1e-5)


def test_small_image_window_rule():
    assert window_for((1, 28, 28)) == (11, 1.5)
    assert window_for((3, 32, 32)) == (11, 1.5)
    assert window_for((1, 8, 8)) == (7, 1.5)
    assert window_for((1, 9, 12)) == (9, 1.5)
    assert window_for((5, 1, 8, 10)) == (7, 1.5)
    assert window_description(7, 1.5) == "gaussian 7x7, sigma 1.5, valid (no padding)"
    with pytest.raises(ConfigError):
        window_for((1, 8, 8), win_size=11)
    x = blobs(4, 1, 8, 7)
    y = blobs(4, 1, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # no "skipping smoothing" warning
        p = ssim_pairs(x, y)
    assert (ssim_matrix(x, y).diagonal() - p).abs().max() < 1e-5
    assert torch.allclose(ssim_matrix(x, x).diagonal(), torch.ones(4, dtype=torch.float64),
                          atol=1e-5)
    res = evaluate_images(y, x)
    assert res.metrics["ssim_window"] == "gaussian 7x7, sigma 1.5, valid (no padding)"


def test_input_validation(mnist):
    with pytest.raises(DataError):
        ssim_matrix(mnist[:2] - 0.5, mnist[:2])              # not display space
    with pytest.raises(DataError):
        ssim_matrix(mnist[:2], torch.rand(2, 3, 28, 28))     # shapes differ
    bad = mnist[:2].clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(DataError):
        evaluate_images(bad, mnist[:3])
    with pytest.raises(ConfigError):
        evaluate_images(mnist[:2], mnist[:3], match="cosine")


# ---------------------------------------------------------------- matching

def test_one_to_one_hand_made():
    sim = np.array([[0.9, 0.8, 0.1, 0.0],
                    [0.85, 0.1, 0.2, 0.0],
                    [0.1, 0.7, 0.6, 0.3]])
    # Greedy would give row 0 -> 0 (0.9); the optimum is 0->1, 1->0, 2->2 (0.8+0.85+0.6 = 2.25).
    rows, cols, vals = one_to_one(sim)
    assert rows.tolist() == [0, 1, 2] and cols.tolist() == [1, 0, 2]
    np.testing.assert_allclose(vals, [0.8, 0.85, 0.6])
    # more rows than columns (m < n): only m rows are matched
    rows, cols, vals = one_to_one(sim.T)
    assert len(rows) == 3 and sorted(cols.tolist()) == [0, 1, 2]
    assert abs(vals.sum() - 2.25) < 1e-12
    idx, val = best_match(sim)
    assert idx.tolist() == [0, 0, 1] and np.allclose(val, [0.9, 0.85, 0.7])


def test_nearest_vs_one_to_one_counts(mnist):
    train = mnist[:4]
    cands = torch.cat([train[:1], torch.zeros(3, 1, 28, 28, dtype=torch.float64)])
    # candidate 0 is a copy of train 0 and also the best candidate of the other images
    # whose other candidates are blank; it can be claimed by only one of them one-to-one.
    cands = torch.cat([cands, 0.5 * train[1:2] + 0.5 * train[2:3]])
    res = evaluate_images(cands, train)
    m = res.metrics
    assert m["ssim>=0.4"] >= m["one_to_one_ssim>=0.4"]
    assert m["distinct_candidates_matched"] < 4
    assert m["one_to_one_matched"] == 4
    assert len(set(res.arrays["one_to_one_candidate"].tolist())) == 4
    assert res.arrays["ssim"][0] == pytest.approx(1.0, abs=1e-5)
    # same scenario on a synthetic matrix: one candidate is best for three rows
    sim = np.array([[0.9, 0.1, 0.1], [0.8, 0.2, 0.1], [0.7, 0.1, 0.3]])
    _, nn = best_match(sim)
    _, _, oto = one_to_one(sim)
    assert (nn >= 0.4).sum() == 3 and (oto >= 0.4).sum() == 1


@pytest.mark.parametrize("rule", ["ssim", "l2", "ncc"])
def test_memorisation_count_exact(mnist, rule):
    # 27 training digits of classes 0-6 and one each of 7, 8, 9; the candidates are exact copies
    # of those three plus uniform noise; the pool is 300 other digits of all classes.
    labels = mnist.labels
    low = np.flatnonzero(labels < 7)[:27]
    high = [int(np.flatnonzero(labels == c)[0]) for c in (7, 8, 9)]
    train_idx = np.concatenate([low[:5], high[:1], low[5:15], high[1:2], low[15:], high[2:]])
    train = mnist[torch.as_tensor(train_idx)]
    copied = [int(np.flatnonzero(train_idx == h)[0]) for h in high]
    pool_idx = np.setdiff1d(np.arange(400), train_idx)[:300]
    pool = mnist[torch.as_tensor(pool_idx)]                  # unseen digits, disjoint from train
    g = torch.Generator().manual_seed(2)
    noise = torch.rand(20, 1, 28, 28, generator=g, dtype=torch.float64)
    cands = torch.cat([train[copied], noise])
    res = evaluate_images(cands, train, pool=pool, match=rule)
    m, a = res.metrics, res.arrays
    assert m["memorised"] == 3
    assert np.flatnonzero(a["memorised"]).tolist() == copied
    assert m["pool_size"] == 300 and m["match_rule"] == rule
    assert m["pool_exact_copies_of_train"] == 0
    assert m["memorised_if_candidates_were_real_unseen_images"] == pytest.approx(30 * 23 / 323)
    assert a["best_candidate"][copied].tolist() == [0, 1, 2]
    np.testing.assert_allclose(a["ssim"][copied], 1.0, atol=1e-5)
    # pool SSIM equals the SSIM of the chosen pool image (same rule applied to the pool)
    chosen = ssim_pairs(train, pool[torch.as_tensor(a["best_pool"])]).numpy()
    np.testing.assert_allclose(a["pool_ssim"], chosen, atol=1e-5)
    if rule == "ssim":
        # unseen digits already reach SSIM >= 0.4 for many training digits: 0.4 alone is no proof
        assert m["pool_ssim>=0.4"] > 3


def test_distance_matrices():
    a = blobs(3, 3, 32, 9)
    assert torch.allclose(l2_matrix(a, a).diagonal(), torch.zeros(3, dtype=torch.float64),
                          atol=1e-6)
    n = ncc_matrix(a, 0.5 * a + 0.1)                         # NCC is invariant to affine maps
    assert torch.allclose(n.diagonal(), torch.ones(3, dtype=torch.float64), atol=1e-9)
    res = match(a, torch.flip(a, dims=[0]), rule="l2")       # 32x32 colour: downsampled 2x
    assert res["best"].tolist() == [2, 1, 0]


# ---------------------------------------------------------------- files and plots

def test_metrics_json_and_plots(mnist, tmp_path):
    train, pool = mnist[:20], mnist[200:300]
    g = torch.Generator().manual_seed(3)
    cands = torch.cat([(train[:5] + 0.1 * torch.randn(5, 1, 28, 28, generator=g,
                                                      dtype=torch.float64)).clamp(0, 1),
                       torch.rand(10, 1, 28, 28, generator=g, dtype=torch.float64)])
    margins = np.linspace(0.5, 3.0, 20)
    res = evaluate_images(cands, train, pool=pool, margins=margins)
    paths = res.save(tmp_path / "eval")
    metrics = json.loads(paths["metrics"].read_text())
    for key in ["n_train", "n_candidates", "pool_size", "ssim_window", "match_rule", "ssim>=0.4",
                "ssim>=0.5", "ssim_mean", "ssim_median", "one_to_one_ssim>=0.4",
                "one_to_one_ssim>=0.5", "one_to_one_ssim_mean", "distinct_candidates_matched",
                "memorised", "pool_ssim>=0.4", "pool_ssim_mean", "margin_spearman_rho",
                "margin_spearman_p"]:
        assert key in metrics, key
    assert metrics["n_train"] == 20 and metrics["n_candidates"] == 15
    assert metrics["support_estimate"] == pytest.approx(support_estimate(margins))
    assert metrics["pool_size"] == 100
    assert metrics["ssim_window"] == "gaussian 11x11, sigma 1.5, valid (no padding)"
    with np.load(paths["arrays"]) as arr:
        for key in ["ssim", "best_candidate", "one_to_one_ssim", "one_to_one_candidate",
                    "pool_ssim", "best_pool", "memorised", "margin"]:
            assert arr[key].shape == (20,), key
    assert "ssim>=0.4" in res.summary()

    # without a pool the memorisation count is null, with a note
    nopool = evaluate_images(cands, train)
    nopool.save(tmp_path / "nopool")
    m2 = json.loads((tmp_path / "nopool" / "metrics.json").read_text())
    assert m2["memorised"] is None and "memorised_note" in m2

    outs = [plot_sorted_ssim(res, tmp_path / "sorted.png"),
            plot_ssim_vs_margin(res, tmp_path / "margin.png"),
            pairs_grid(cands, train, pool, res, tmp_path / "best.png", which="best", k=8),
            pairs_grid(cands, train, pool, res, tmp_path / "worst.png", which="worst", k=8),
            pairs_grid(cands, train, None, nopool, tmp_path / "nopool.png", k=4),
            candidates_grid(cands, tmp_path / "cands.png", k=15),
            plot_sorted_ssim(nopool, tmp_path / "sorted_nopool.png")]
    rgb = blobs(6, 3, 32, 10)
    rgb_res = evaluate_images(rgb[:3], rgb[3:], pool=rgb[:3])
    outs.append(pairs_grid(rgb[:3], rgb[3:], rgb[:3], rgb_res, tmp_path / "rgb.png", k=3))
    for p in outs:
        assert p.exists() and p.stat().st_size > 1000
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_importing_exhume_keeps_the_users_matplotlib_backend(tmp_path):
    # a notebook user's backend survives importing every module that draws, and figures still render to PNG
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg'); import torch\n"
            "import exhume, exhume.evaluation.plots, exhume.evaluation.trainlike, exhume.experiments\n"
            "from exhume.evaluation.plots import candidates_grid\n"
            f"candidates_grid(torch.rand(4, 1, 8, 8), {str(tmp_path / 'c.png')!r})\n"
            "import matplotlib.pyplot as plt; print(matplotlib.get_backend(), len(plt.get_fignums()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    assert out.stdout.split() == ["svg", "0"]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_support_estimate_is_the_participation_ratio_of_the_logistic_multipliers():
    # equal margins: every point carries the equation alike
    assert support_estimate(np.full(37, 4.0)) == pytest.approx(37.0)
    # one point far closer to the boundary than the rest: about one point carries it
    assert support_estimate(np.r_[0.5, np.full(99, 25.0)]) == pytest.approx(1.0, abs=1e-6)
    # k points tied at the smallest margin, the rest far away: about k
    assert support_estimate(np.r_[np.full(12, 2.0), np.full(88, 40.0)]) == pytest.approx(12.0, abs=1e-6)
    # the formula, by hand, on spread margins
    q = np.random.default_rng(0).uniform(-1.0, 8.0, 50)
    w = 1.0 / (1.0 + np.exp(q))
    assert support_estimate(q) == pytest.approx(w.sum() ** 2 / (w**2).sum(), rel=1e-12)
    # margins of a very long training run do not underflow to 0/0
    assert support_estimate(np.array([1000.0, 1000.0, 2000.0])) == pytest.approx(2.0)
    assert support_estimate(np.array([])) is None


def test_support_estimate_of_a_cross_entropy_multiclass_model_weighs_each_point_by_one_minus_p_y():
    # cross-entropy weighs training point i by 1 − p_y(x_i) = σ(−soft margin), not σ(−runner-up margin)
    import exhume
    from exhume.attacks import Reconstruction, RunRecord
    from exhume.data import dataset_of, make_pool
    from exhume.evaluation.run import evaluate, margins_of
    from exhume.victim import TrainConfig, make_victim

    torch.manual_seed(0)
    victim = make_victim("digits", "multiclass", 30, "mlp:32;bias=none;init=1e-3",
                         TrainConfig(loss="cross-entropy", lr=0.2, weight_decay=5e-3, max_epochs=300), seed=0, progress=False,
                         test_size=0)
    train = victim.load_train_set()
    with torch.no_grad():
        p = torch.softmax(victim.model.float()(train.centred.float()), 1).double()
    w = (1.0 - p.gather(1, train.y.long()[:, None]).squeeze(1)).numpy()
    expected = w.sum() ** 2 / (w**2).sum()
    runner_up = support_estimate(margins_of(victim.model, train.centred.float(), train.y, victim.task, victim.loss)[0])
    assert abs(runner_up - expected) > 1.0  # the runner-up margin's weights are another estimate on this model

    recon = Reconstruction("kkt", candidates=train.x[:6].clone(), labels=train.y[:6].clone(), scores=None, record=RunRecord(), seed=0)
    got = evaluate(recon, victim, pool_size=60, figures=False).metrics
    assert got["support_estimate"] == pytest.approx(expected, rel=1e-4)

    # the audit of the same model and data (arrays, no victim file) reports the same estimate
    unseen = make_pool(dataset_of(victim.data_spec), "multiclass", 80, exclude=train.indices, seed=3)
    r = exhume.audit(victim.model, (train.x.numpy(), train.y.numpy()), unseen.x.numpy(), loss="cross-entropy",
                     weight_decay=5e-3, normalize=(train.mean, 1.0), attack_args={"iterations": 20}, progress=False)
    assert r.metrics["support_estimate"] == pytest.approx(expected, rel=1e-4)
