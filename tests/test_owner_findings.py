"""What only the owner's audit measures: the equation's identifiability at the training images, and membership
exposure from the weights (per-record scores against unseen records)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from exhume.attacks import PortfolioRecord, Reconstruction, RestartRecord, RunRecord
from exhume.equations.kinds import Stationarity
from exhume.evaluation.identifiability import identifiability
from exhume.evaluation.verdict import decide
from exhume.evaluation.weights_membership import membership_exposure, roc_summary, tpr_at
from exhume.victim import AttackerView

SHAPE = (1, 8, 8)


def _view(model, wd: float = 1e-3):
    return AttackerView(model=model, task="binary", input_shape=SHAPE, mean=torch.zeros(SHAPE), loss="logistic",
                        weight_decay=wd, n_train_hint=10)


def _train(x, y, wd: float, steps: int, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1), nn.Flatten(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=wd)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.softplus(-y * model(x)).mean().backward()
        opt.step()
    return model.eval()


def _points(count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(count, *SHAPE, generator=gen), torch.where(torch.rand(count, generator=gen) > 0.5, 1.0, -1.0)


def test_a_model_that_memorised_ten_points_exposes_them_from_its_weights():
    """Ten random points with random labels, memorised: the gradient alignment with θ_T flags them at 1 % FPR."""
    x, y = _points(10, 0)
    out, out_y = _points(300, 1)
    model = _train(x, y, 1e-3, 300)
    record, arrays = membership_exposure(_view(model), x, y, out, out_y, seed=0)
    align = record["scores"]["gradient_alignment"]
    assert align["auc"]["ci95"][0] > 0.9 and align["tpr_at_0.01_fpr"]["ci95"][0] > 0.01
    assert record["exposed"] and "above 1 %" in record["finding"]
    assert set(arrays) == {"loss_members", "loss_nonmembers", "gradient_alignment_members", "gradient_alignment_nonmembers"}
    assert record["nonmember_labels"] == "given" and record["lowest_fpr_resolved"] == 1 / 300


def test_records_the_model_never_trained_on_score_at_chance():
    """'Members' that are not members (the model trained on other points): every score's AUC interval holds 0.5."""
    x, y = _points(200, 2)
    model = _train(x, y, 1e-3, 300)
    fake, fake_y = _points(100, 3)
    out, out_y = _points(300, 4)
    record, _ = membership_exposure(_view(model), fake, fake_y, out, out_y, seed=0)
    for name, s in record["scores"].items():
        lo, hi = s["auc"]["ci95"]
        assert lo < 0.5 < hi, (name, s["auc"])
    assert not record["exposed"] and "not above 1 %" in record["finding"]


def test_tpr_at_low_fpr_counts_members_above_the_allowed_false_positives():
    neg = np.arange(100.0)  # at 1 % FPR one non-member may pass: the threshold is the second highest, 98
    assert tpr_at(np.array([98.5, 99.5, 10.0, 97.0]), neg, 0.01) == 0.5
    assert tpr_at(np.array([98.5, 99.5]), neg, 0.001) == 0.5  # 0.1 % of 100: none may pass, threshold 99
    got = roc_summary(np.arange(50.0) + 1000, neg, seed=0, resamples=50)
    assert got["auc"] == {"value": 1.0, "ci95": [1.0, 1.0]} and got["tpr_at_0.01_fpr"]["value"] == 1.0


def _linear_case(share: float):
    """A linear binary model whose weights are Σ a_i y_i x_i + r, r orthogonal to the points: at the training
    points the least-squares residual is exactly ‖r‖²/‖θ‖²."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, *SHAPE, generator=gen, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1], dtype=torch.float64)
    flat = x.reshape(5, -1)
    spanned = ((torch.rand(5, generator=gen, dtype=torch.float64) + 0.5) * y) @ flat  # a_i y_i, a_i > 0
    r = torch.randn(64, generator=gen, dtype=torch.float64)
    r -= torch.linalg.lstsq(flat.T, r).solution @ flat  # off the points' span
    r *= (share / (1 - share) * spanned.dot(spanned) / r.dot(r)).sqrt()
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 1, bias=False), nn.Flatten(0)).double()
    with torch.no_grad():
        model[1].weight.copy_((spanned + r)[None])
    return model, x, y


def test_identifiability_compares_the_attack_with_the_equation_at_the_training_points():
    model, x, y = _linear_case(share=0.2)
    pooled = PortfolioRecord(restarts=tuple(RestartRecord(k, "complete", final_relative_stationarity=r) for k, r in enumerate((0.3, 0.1, None))))
    recon = Reconstruction(method="kkt", candidates=torch.zeros(10, *SHAPE), labels=torch.ones(10), scores=None, seed=0,
                           record=RunRecord(settings={"formulation": "margin", "denoise": "off"}, portfolio=pooled))
    got = identifiability(Stationarity(), model, x, y, "logistic", {}, recon)
    assert abs(got["residual_at_training"] - 0.2) < 1e-6  # ‖r‖²/‖θ‖² by construction (gradients in float32)
    assert got["attack_best_residual"] == 0.1 and got["attack_restarts"] == 2
    assert abs(got["attack_to_truth"] - 0.5) < 1e-5 and got["admits_other_images"]
    metrics = {"memorised": 0, "n_train": 5, "memorised_control": 0, "control_size": 50, "pool_size": 500,
               "identifiability": got}
    verdict = decide(metrics)  # would be "no evidence" without it
    assert verdict.verdict == "inconclusive" and "admits other images that fit the weights better" in verdict.reason
    fits = decide({**metrics, "identifiability": {**got, "attack_best_residual": 0.3, "attack_to_truth": 1.5,
                                                  "admits_other_images": False}})
    assert fits.verdict == "no evidence" and "Identifiability: residual at the training images 0.2" in fits.reason
    leak = decide({**metrics, "memorised": 5, "memorised_control": 0})
    assert leak.verdict == "leaks"


def test_identifiability_is_not_measured_for_a_run_without_a_residual():
    model, x, y = _linear_case(share=0.2)
    recon = Reconstruction(method="inversion", candidates=torch.zeros(3, *SHAPE), labels=torch.ones(3), scores=None, seed=0,
                           record=RunRecord())
    got = identifiability(Stationarity(), model, x, y, "logistic", {}, recon)
    assert got["attack_to_truth"] is None and got["note"].startswith("not measured")
    assert decide({"memorised": 0, "n_train": 5, "memorised_control": 0, "control_size": 50, "pool_size": 500,
                   "identifiability": got}).verdict == "no evidence"


@pytest.mark.parametrize("n, m, ties", [(4, 60, False), (20, 200, True), (7, 1500, True)])
def test_the_batched_bootstrap_equals_one_resample_at_a_time(n, m, ties):
    """roc_summary's resamples, all at once, give the statistics of auc_mann_whitney and tpr_at on each, bit for bit."""
    from exhume.evaluation.membership import auc_mann_whitney
    from exhume.evaluation.weights_membership import FPRS, _boot_stats

    rng = np.random.default_rng(n)
    pos, neg = rng.normal(1.0, 1.0, n), rng.normal(0.0, 1.0, m)
    if ties:
        pos, neg = np.round(pos, 1), np.round(neg, 1)
    ia, ib = rng.integers(0, n, (300, n)), rng.integers(0, m, (300, m))
    loop = np.array([[auc_mann_whitney(pos[a], neg[b])] + [tpr_at(pos[a], neg[b], f) for f in FPRS] for a, b in zip(ia, ib)])
    assert np.array_equal(_boot_stats(pos, neg, ia, ib), loop)
    # and roc_summary's intervals are those of the one-at-a-time loop over the same seeded draws
    draws = np.random.default_rng(3)
    pairs = [(draws.integers(0, n, n), draws.integers(0, m, m)) for _ in range(300)]
    ref = np.array([[auc_mann_whitney(pos[a], neg[b])] + [tpr_at(pos[a], neg[b], f) for f in FPRS] for a, b in pairs])
    got = roc_summary(pos, neg, seed=3, resamples=300)
    for i, key in enumerate(["auc"] + [f"tpr_at_{f:g}_fpr" for f in FPRS]):
        assert got[key]["ci95"] == [float(np.percentile(ref[:, i], 2.5)), float(np.percentile(ref[:, i], 97.5))], key
