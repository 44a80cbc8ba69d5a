"""Measure the relative stationarity residual (on the true training data) and the attack's final
residual on several small victims, next to what the attack recovered (memorised vs control), to
choose exhume.evaluation.assumptions' thresholds. Run: nice python benchmarks/audit_thresholds.py
"""
import json
import sys
import time

import torch

import exhume
from exhume.evaluation.residuals import relative_stationarity
from exhume.evaluation.verdict import fisher_p
from exhume.victim import TrainConfig, make_victim

torch.set_num_threads(1)
CASES = [  # name, data, n, arch, wd, epochs, attack iterations
    ("digits-mlp-wd-100ep", "digits", 20, "mlp:64;bias=none;init=1e-3", 5e-3, 100, 2000),
    ("digits-mlp-wd-1000ep", "digits", 20, "mlp:64;bias=none;init=1e-3", 5e-3, 1000, 2000),
    ("digits-mlp-wd-6000ep", "digits", 20, "mlp:64;bias=none;init=1e-3", 5e-3, 6000, 2000),
    ("digits-cnn-wd-3000ep", "digits", 10, "cnn:8;fc=128;pool=none", 5e-3, 3000, 2500),
    ("digits-mlp-bias-wd-3000ep", "digits", 20, "mlp:64,32;bias=all;init=1e-3", 5e-3, 3000, 2000),
    ("digits-mlp-nowd-50ep", "digits", 20, "mlp:64;bias=none;init=1e-3", 0.0, 50, 2000),
    ("digits-mlp-nowd-3000ep", "digits", 20, "mlp:64;bias=none;init=1e-3", 0.0, 3000, 2000),
    ("mnist-mlp-wd-400ep", "mnist", 20, "mlp:32;bias=none;init=1e-3", 5e-3, 400, 1500),
]
rows = []
only = set(sys.argv[1:])
for name, data, n, arch, wd, epochs, iters in CASES:
    if only and name not in only:
        continue
    torch.manual_seed(0)
    v = make_victim(data, "odd-even", n, arch, TrainConfig(loss="logistic", lr=0.2, weight_decay=wd, max_epochs=epochs),
                    seed=0, progress=False, test_size=200)
    train = v.load_train_set()
    st = relative_stationarity(v.model, train.centred, train.y, "logistic", wd)
    t0 = time.perf_counter()
    recon = exhume.attack(v, "kkt", seed=0, progress=False, iterations=iters, **({"tv_weight": 1e-4} if "cnn" in arch else {}))
    m = exhume.evaluate(recon, v, pool_size=300, figures=False).metrics
    row = {"case": name, "wd": wd, "epochs": epochs, "train_acc": v.metrics["train_accuracy"],
           "stationarity": round(st["value"], 4), "attack_iterations": recon.summary["iterations"],
           "attack_seconds": round(time.perf_counter() - t0, 1),
           "attack_final_residual": round(recon.summary["final_relative_stationarity"], 4),
           "memorised": m["memorised"], "control": m["memorised_control"], "n": m["n_train"],
           "p": round(fisher_p(m["memorised"], m["n_train"], m["memorised_control"], m["control_size"]), 4)}
    rows.append(row)
    print(json.dumps(row), flush=True)
