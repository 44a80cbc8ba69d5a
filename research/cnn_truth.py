"""EVALUATOR-SIDE: the stationarity equation at a CNN victim's training images, beside where its weights show the span.

    python research/cnn_truth.py VICTIM [VICTIM ...]   # one JSON line each (one-off, not maintained)

``truth_nnls``: ‖θ − Σ λ_i ∇θ h(x_i)‖² / ‖θ‖² with λ ≥ 0 fitted by non-negative least squares (the exact ReLU
derivative); ``truth_decay_lambda``: with the multipliers weight decay implies, σ(−h_i)/(n·w) (research/cnn_curve.py).
Then each wide layer's σ_{n+1}/σ_1 and the training inputs' distance to its top-n row space
(exhume/evaluation/layers.py).
"""

from __future__ import annotations

import json
import sys

import torch
from cnn_curve import truth_residuals

from exhume.evaluation.layers import layer_diagnostics
from exhume.victim import load_victim

torch.set_num_threads(1)
for path in sys.argv[1:]:
    v = load_victim(path)
    row = {"victim": path, "epochs": v.metrics.get("epochs"), **truth_residuals(v)}
    rep = layer_diagnostics(v.model, v.train_set.centred.float())
    for r in rep["layers"]:
        if r.get("input_distance_median") is not None:
            row[r["name"]] = {"sigma_after_n": r["sigma_after_n"], "rank_999": r["rank_999"],
                              "input_distance_median": r["input_distance_median"],
                              "near_zero_1e-2": r.get("preactivations_within_0.01")}
    row["conv_near_zero_1e-2"] = rep["layers"][0].get("preactivations_within_0.01")
    print(json.dumps(row), flush=True)
