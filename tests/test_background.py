"""kkt's dark floor (``background``): the soft threshold on the returned candidates and when ``"auto"`` applies it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_subspace import N, _digits, _victim  # the 784-64-64 victim trained on 12 bundled MNIST digits

from exhume.attacks import get_attack
from exhume.attacks.engine.priors import BACKGROUND_TAU, background_level, dark_floor
from exhume.data.datasets import load_bundled_mnist
from exhume.errors import ConfigError
from exhume.evaluation.metrics import evaluate_images


def test_dark_floor_zeroes_the_haze_and_keeps_full_brightness():
    v = torch.tensor([-0.2, 0.0, 0.05, 0.1, 0.4, 1.0, 1.2])
    out = dark_floor(v, 0.1)
    assert torch.equal(out[:4], torch.zeros(4))  # at or below τ: the background, exactly 0
    assert out[4] == pytest.approx(0.3 / 0.9) and out[5] == pytest.approx(1.0)  # stretched back to the range
    assert out[6] > 1.0  # above the range stays above it (the evaluator clamps)
    assert torch.all(torch.diff(out) >= 0)  # monotone: no pixel changes rank
    assert dark_floor(v, 0.0) is v


def test_auto_reads_a_dark_background_from_the_data_mean_only():
    mnist_mean = torch.from_numpy(load_bundled_mnist().images[:1000]).float().mean(0)  # (1, 28, 28), corners 0
    tau, why = background_level("auto", mnist_mean, (1, 28, 28))
    assert tau == BACKGROUND_TAU and "dark" in why
    bright = 0.3 + 0.4 * torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))  # a natural-image mean
    assert background_level("auto", bright, (3, 32, 32))[0] == 0.0
    flat = torch.full((1, 28, 28), 0.13)  # one number for the whole image: no per-pixel background to read
    assert background_level("auto", flat, (1, 28, 28)) == (0.0, "the data mean is one number per channel: no per-pixel background to read")
    assert background_level("auto", torch.zeros(10), (10,)) == (0.0, "not image inputs")
    assert background_level(0.25, bright, (3, 32, 32)) == (0.25, "given")


@pytest.mark.parametrize("value", [-0.1, 0.6, "on", True, math.nan, None])
def test_kkt_rejects_a_bad_background(value):
    with pytest.raises(ConfigError, match="^background must"):
        get_attack("kkt", background=value)


def _best_ssim(candidates: torch.Tensor) -> np.ndarray:
    x, _, _ = _digits()
    return evaluate_images(candidates.float().clamp(0, 1), x).arrays["ssim"]


def test_the_floor_changes_the_output_only_and_brings_the_digits_closer():
    view = _victim()
    kw = dict(iterations=400, m=2 * N)  # eager steps (a short run by its settings): equal losses
    raw = get_attack("kkt", background=0, **kw).run(view, progress=False, seed=0, log_every=100)
    auto = get_attack("kkt", **kw).run(view, progress=False, seed=0, log_every=100)  # background="auto", the default
    assert raw.config["background_used"] == 0.0 and auto.config["background_used"] == BACKGROUND_TAU
    assert "dark" in auto.config["background_reason"]
    # the same optimisation: the same losses, multipliers and snapshot; the candidates differ by the floor alone
    untimed = [[{k: v for k, v in r.items() if k != "seconds"} for r in rec.loss_history] for rec in (raw, auto)]
    assert untimed[0] == untimed[1] and torch.equal(raw.scores, auto.scores)
    assert torch.equal(auto.candidates, dark_floor(raw.candidates, BACKGROUND_TAU))
    assert float((auto.candidates == 0).float().mean()) > 0.4  # most of a digit image is its black background (measured 0.56)
    before, after = _best_ssim(raw.candidates), _best_ssim(auto.candidates)  # measured: mean 0.534 -> 0.550, 11 of 12 closer
    assert after.mean() > before.mean() + 0.01 and (after > before).sum() >= N - 2


def test_a_run_resumes_under_another_background(tmp_path):
    view = _victim()
    get_attack("kkt", iterations=60, m=2 * N, background=0).run(view, out=tmp_path, progress=False, checkpoint_every=30)
    resumed = get_attack("kkt", iterations=90, m=2 * N).run(view, out=tmp_path, resume=True, progress=False, checkpoint_every=30)
    assert resumed.summary["iterations"] == 90 and resumed.config["background_used"] == BACKGROUND_TAU
