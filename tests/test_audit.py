"""`exhume audit` / `exhume.audit`: a user's own model class, weights and images in, a verdict out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits

import exhume
from exhume.audit import audit
from exhume.cli import main
from exhume.evaluation.verdict import VERDICTS

ROOT = Path(__file__).resolve().parents[1]
USER_MODEL = '''
import torch
from torch import nn


class TinyNet(nn.Module):
    """A user's MLP for 8x8 digits: biases everywhere, widths exhume never builds."""

    def __init__(self, hidden: int = 24, second: int = 12):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, second), nn.ReLU(),
                                  nn.Linear(second, 1))

    def forward(self, x):
        return self.body(x)
'''
MEAN, STD = 0.3, 0.4


def _train(model, x, y, wd, epochs, lr=0.2):
    """A plain PyTorch loop (not exhume's): full-batch SGD, BCE-with-logits, inputs (x - 0.3) / 0.4."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    xt, yt = (torch.from_numpy(x) - MEAN) / STD, torch.from_numpy(y).float()
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(xt).squeeze(1), yt).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's files: model.py, weights (safetensors and a .pt state dict), train.npz, unseen.npz."""
    root = tmp_path_factory.mktemp("user")
    (root / "model.py").write_text(USER_MODEL)
    sys.path.insert(0, str(root))
    try:
        from model import TinyNet
    finally:
        sys.path.remove(str(root))
    digits = load_digits()
    images, labels = (digits.images / 16.0).astype(np.float32)[:, None], digits.target
    order = np.random.default_rng(0).permutation(len(images))
    train, unseen = order[:20], order[20:220]
    x, y = images[train], (labels[train] % 2).astype(np.int64)
    np.savez(root / "train.npz", x=(x[:, 0] * 255).round().astype(np.uint8), y=y)
    np.savez(root / "unseen.npz", x=images[unseen])
    torch.manual_seed(0)
    net = _train(TinyNet(hidden=24), x, y, wd=5e-3, epochs=1500)
    save_file(net.state_dict(), str(root / "net.safetensors"))
    torch.save(net.state_dict(), root / "net.pt")
    torch.save(net, root / "whole.pt")  # a pickled module: must be refused
    return {"root": root, "cls": TinyNet, "x": x, "y": y, "unseen": images[unseen]}


def test_audit_cli_on_a_users_own_model_writes_a_verdict_and_a_report(user, tmp_path, capsys):
    """Subprocess, stderr not a terminal: exit 0, metrics.json with verdict / p-value / counts, a report chromium loads."""
    from test_report import open_in_chromium

    root, out = user["root"], tmp_path / "audit"
    (tmp_path / "audit.toml").write_text(
        f'model = "{root / "model.py"}:TinyNet"\nweights = "{root / "net.safetensors"}"\ntrain = "{root / "train.npz"}"\n'
        f'unseen = "{root / "unseen.npz"}"\nnormalize = "{MEAN},{STD}"\nloss = "bce"\nweight_decay = 0.5\n[model_args]\nhidden = 24\n')
    cmd = [sys.executable, "-m", "exhume", "audit", "--config", str(tmp_path / "audit.toml"), "--weight-decay", "5e-3",
           "--max-seconds", "60", "-p", "iterations=200", "-o", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 8  # no bar frames: a line per ~10 s at most
    m = json.loads((out / "evaluation" / "metrics.json").read_text())
    assert m["verdict"] in VERDICTS and m["verdict_reason"] and m["alpha"] == 0.05
    assert 0 <= m["p_value"] <= 1 and m["n_train"] == 20 and m["control_size"] == 20 and m["pool_size"] == 180
    assert m["victim"]["weight_decay"] == 5e-3  # the flag overrides the config
    assert m["victim"]["normalisation"] == "(x - mean) / std" and m["victim"]["positive_class"] == 1
    restarts = m["attack"]["config"]["portfolio"]["restarts"]  # the audit spends its budget on the attack's portfolio
    assert len(restarts) >= 1 and all(r["iterations"] == 200 for r in restarts) and m["attack"]["iterations"] == 200 * len(restarts)
    assert f"verdict: {m['verdict'].upper()}" in proc.stdout
    assert f"(oracle {m['memorised_control_oracle']}: the training images themselves as candidates)" in proc.stdout
    got = open_in_chromium(out / "report.html", tmp_path)
    assert got["ready"] == "complete" and f"Verdict: {m['verdict'].upper()}" in got["verdict"]
    assert len(got["images"]) == 6 and all(c and w > 0 for c, w, _, _ in got["images"])  # the five figures and the membership ROC
    assert "membership ROC" in [alt for _, _, _, alt in got["images"]]
    assert m["layers"]["n"] == 20 and 'id="layers"' in (out / "report.html").read_text()
    assert got["errors"] == [] and [r for r in got["resources"] if not r.startswith("data:")] == []
    argv = cmd[3:]  # the same command in this process: the subprocess above is what tests the entry point
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--force" in err
    assert main(argv[:-2] + ["-p", "iterations=20", "--force", "-o", str(out)]) == 0
    redone = json.loads((out / "evaluation" / "metrics.json").read_text())["attack"]["config"]["portfolio"]["restarts"]
    assert all(r["iterations"] == 20 for r in redone)


def test_brief_training_without_weight_decay_is_inconclusive_with_the_reason(user):
    torch.manual_seed(1)
    net = _train(user["cls"](hidden=24), user["x"], user["y"], wd=0.0, epochs=15)
    r = audit(net, (user["x"], user["y"]), user["unseen"], loss="logistic", weight_decay=0, normalize=(MEAN, STD),
              attack_args={"iterations": 300, "restarts": 2}, progress=False)
    assert r.verdict == "inconclusive", r.reason
    assert "trained too briefly" in r.reason or "did not find candidates" in r.reason
    assert r.metrics["assumption_failures"] and r.metrics["verdict"] == "inconclusive"


@pytest.fixture(scope="module")
def leaky(leaky_victim_dir):
    """A small victim that truly leaks: bias-free MLP on 20 MNIST digits (measured 11 of 20 memorised, control 0)."""
    victim = exhume.load_victim(leaky_victim_dir)
    from exhume.data import dataset_of, make_pool

    train = victim.load_train_set()
    unseen = make_pool(dataset_of(victim.data_spec), "odd-even", 300, exclude=train.indices, seed=3)
    return victim, train, unseen


def test_a_model_that_leaks_gets_leaks(leaky):
    victim, train, unseen = leaky
    labels = (train.y.numpy() > 0).astype(np.int64)  # one logit: label 1 is +1
    r = exhume.audit(victim.model, (train.x.numpy(), labels), unseen.x.numpy(), loss="logistic", weight_decay=5e-3,
                     normalize=(train.mean, 1.0), attack_args={"iterations": 1500, "restarts": 2}, progress=False)
    # measured with two restarts (not as many as 300 s would buy): memorised 9, 9, 11 of 20 at audit seeds 0-2, control 0 of 20, p <= 6e-4
    assert r.verdict == "leaks", r.reason
    assert r.metrics["p_value"] < 0.01 and r.metrics["memorised"] > r.metrics["memorised_control"]
    layers = r.metrics["layers"]  # recorded, and the reason says where the weights show the span
    first = layers["layers"][0]
    assert layers["n"] == 20 and layers["span_layer"] == first["name"] and first["shows_span"] and layers["finding"] in r.reason
    with torch.no_grad():  # the first layer's pre-activations at the centred training digits, measured here independently
        z = victim.model.net[0](train.centred.flatten(1).float())
    assert first["preactivations_within_0.01"] == pytest.approx(float((z.abs() <= 1e-2).double().mean()), abs=1e-9)


def test_the_audits_reason_and_kkts_projection_read_the_span_by_one_rule(leaky):
    """The leaky victim's first layer: σ_21/σ_1 ≈ 0.0104, above SPAN_GAP, but within its initialisation's noise; the
    audit's report and kkt's projection take it alike (exhume/equations/span.py: span_of)."""
    from exhume.equations.span import layer_spectra

    victim, train, _ = leaky
    spectra = layer_spectra(victim.model, len(train.x))
    kkt = exhume.attack(victim, "kkt", restarts=1, iterations=1, progress=False).config
    first = spectra["layers"][0]
    assert spectra["span_layer"] == kkt["subspace_layer"] == first["name"] and kkt["subspace_used"] == "above-noise"
    assert first["rank"] == kkt["subspace_rank"] and "within its initialisation's noise" in first["why"]


def test_a_model_that_never_saw_the_images_never_gets_leaks(leaky):
    victim, train, unseen = leaky
    other_x, other_y = unseen.x[:20].numpy(), (unseen.y[:20].numpy() > 0).astype(np.int64)  # not its training images
    r = exhume.audit(victim.model, (other_x, other_y), unseen.x[20:].numpy(), loss="logistic", weight_decay=5e-3,
                     normalize=(train.mean, 1.0), attack_args={"iterations": 500, "restarts": 2}, progress=False)
    assert r.verdict in ("no evidence", "inconclusive"), r.reason
    assert r.metrics["victim"]["stationarity_residual"] > 0.5  # its training data is not these images


def _args(user, tmp_path, **over):
    root = user["root"]
    base = {"--model": f"{root / 'model.py'}:TinyNet", "--weights": str(root / "net.safetensors"), "--train": str(root / "train.npz"),
            "--unseen": str(root / "unseen.npz"), "--normalize": f"{MEAN},{STD}", "--loss": "logistic", "--weight-decay": "5e-3",
            "-o": str(tmp_path / "out"), "--no-progress": None}
    base.update(over)
    argv = ["audit"]
    for k, v in base.items():
        if v is not False:
            argv += [k] if v is None else [k, v]
    return argv


@pytest.mark.parametrize("over, needle", [
    ({"--model": "{root}/model.py:NoSuchNet"}, "defines no class 'NoSuchNet'; nn.Module classes found there: TinyNet"),
    ({"--model": "{root}/nope.py:TinyNet"}, "nope.py does not exist"),
    ({"--model-args": '{"hidden": 30}'}, "net.safetensors: body.1.weight has shape (24, 64) but TinyNet expects (30, 64)"),
    ({"--weights": "{root}/whole.pt"}, "whole.pt holds pickled Python objects"),
    ({"--weights": "{root}/pickle.safetensors"}, "pickle.safetensors is not a readable safetensors file (a torch.save file"),
    ({"--train": "{root}/nox.npz"}, "nox.npz has no array 'x'"),
    ({"--train": "{root}/big.npz"}, "unseen.npz: images of shape (1, 8, 8), but {root}/big.npz holds (1, 10, 10)"),
    ({"--train": "{root}/big.npz", "--unseen": "{root}/big.npz"},
     "big.npz: the model failed on a batch of the training images, shape (2, 1, 10, 10)"),
    ({"--weight-decay": "-1"}, "weight_decay: expected a number in [0.0, inf], got -1.0"),
    ({"--weight-decay": "inf"}, "weight_decay: expected a finite number, got inf"),
    ({"--alpha": "0"}, "alpha 0.0: expected a significance level strictly between 0 and 1"),
    ({"--alpha": "2"}, "alpha 2.0: expected a significance level strictly between 0 and 1"),
    ({"--max-seconds": "0"}, "max_seconds (the audit's budget in seconds): expected a number > 0, got 0.0"),
    ({"--max-seconds": "inf"}, "max_seconds (the audit's budget in seconds): expected a finite number, got inf"),
    ({"--positive-class": "7"}, "positive class 7 is not among the training labels [0, 1]"),
    ({"--loss": False}, "loss is not given"),
    ({"--weight-decay": False}, "weight_decay is not given"),
    ({"--normalize": False}, "normalize is not given"),
    ({"--normalize": "0.3"}, "expected an even count"),
    ({"--normalize": "nan,1"}, "--normalize 'nan,1': expected finite numbers"),
])
def test_bad_inputs_give_one_line_naming_the_file_and_exit_2(user, tmp_path, capsys, over, needle):
    root = user["root"]
    (root / "pickle.safetensors").write_bytes((root / "net.pt").read_bytes())
    np.savez(root / "nox.npz", images=user["x"], y=user["y"])
    np.savez(root / "big.npz", x=np.zeros((4, 10, 10), np.float32), y=np.array([0, 1, 0, 1]))
    over = {k: v.replace("{root}", str(root)) if isinstance(v, str) else v for k, v in over.items()}
    assert main(_args(user, tmp_path, **over)) == 2
    err = capsys.readouterr().err
    assert needle.replace("{root}", str(root)) in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_pt_state_dict_loads_like_safetensors(user, tmp_path):
    from exhume.audit import load_model_class, load_weights

    a = load_weights(load_model_class(f"{user['root'] / 'model.py'}:TinyNet", {"hidden": 24}), user["root"] / "net.pt")
    b = load_weights(load_model_class(f"{user['root'] / 'model.py'}:TinyNet", {"hidden": 24}), user["root"] / "net.safetensors")
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_audit_resumes_its_attack_instead_of_starting_over(user, tmp_path, capsys, sig):
    """SIGTERM or SIGKILL in the middle of the attack's portfolio: the workers stop (none left running) and leave
    checkpoints; ``--resume`` continues them and judges the result."""
    restarts = 2
    root, out = user["root"], tmp_path / "audit"
    cmd = [sys.executable, "-m", "exhume", "audit", "--model", f"{root / 'model.py'}:TinyNet", "--model-args", '{"hidden": 24}',
           "--weights", str(root / "net.safetensors"), "--train", str(root / "train.npz"), "--unseen", str(root / "unseen.npz"),
           "--normalize", f"{MEAN},{STD}", "--loss", "logistic", "--weight-decay", "5e-3", "--no-progress", "-o", str(out),
           "--max-seconds", "120", "-p", f"restarts={restarts}", "-p", "checkpoint_every=10"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd + ["-p", "iterations=1000000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not list(out.rglob("checkpoint.pt")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert list(out.rglob("checkpoint.pt")), proc.stderr.read() if proc.poll() is not None else "no checkpoint"
        time.sleep(1.0)
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (143 if sig == signal.SIGTERM else -9) and "Traceback" not in err, err[-2000:]
    assert len(workers) >= restarts - 1  # the audit's own process runs one restart of each wave, the workers the rest
    deadline = time.time() + 60
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{w}").exists() for w in workers), "workers outlived the audit"
    saved = max(int(torch.load(c, weights_only=True)["state"]["iteration"]) for c in out.rglob("checkpoint.pt"))
    assert saved >= 10 and not (out / "evaluation").exists()
    argv = cmd[3:] + ["-p", f"iterations={saved + 5}"]  # in this process: the signals above needed a child, these do not
    capsys.readouterr()
    assert main(argv) == 2 and "--resume" in capsys.readouterr().err  # not silently started over
    assert main(argv + ["--resume"]) == 0
    m = json.loads((out / "evaluation" / "metrics.json").read_text())
    assert m["verdict"] in VERDICTS and m["attack"]["iterations"] == (saved + 5) * restarts  # each run to its new budget


def test_a_training_set_too_large_to_evaluate_is_refused_before_the_attack(user, tmp_path, capsys, monkeypatch):
    import dataclasses

    from exhume.files import limits

    # the user's 20 images and kkt's 2n = 40 candidates: 800 pairs; a limit of 799 stands for 60,000 images' 7.2e9
    monkeypatch.setattr(limits, "LIMITS", dataclasses.replace(limits.LIMITS, one_to_one_entries=799))
    assert main(_args(user, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "train.npz: 20 training images: the evaluation matches every training image with every candidate" in err
    assert "at least 40 candidates (800 pairs), over the limit of 799 pairs" in err and "at most 19 training images" in err
    assert not (tmp_path / "out").exists() and len(err.strip().splitlines()) == 1  # refused before the attack wrote anything


def test_a_cnns_reason_names_the_layer_the_threat_model_and_whether_what_training_added_or_the_weights_show_the_span():
    """A CNN's head trained from a known start over frozen convolutions (a plain PyTorch loop): what training added to the
    fully connected layer has rank ≤ n, its weights keep the start's noise. With the start the reason says the former at
    that layer; with the weights only it says no layer shows the span."""
    from exhume.models import build_model

    digits = load_digits()
    x = (digits.images[:6] / 16.0).astype(np.float32)[:, None]
    y = (digits.target[:6] % 2).astype(np.int64)
    unseen = (digits.images[100:160] / 16.0).astype(np.float32)[:, None]
    torch.manual_seed(0)
    model = build_model("cnn:4;fc=32;pool=avg", (1, 8, 8), 1)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    model.features.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    xt, yt = torch.from_numpy(x) - 0.3, torch.from_numpy(y).float()
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(xt).reshape(-1), yt).backward()
        opt.step()
    model.requires_grad_(True)
    settings = {"loss": "logistic", "weight_decay": 0, "normalize": (0.3, 1.0), "attack_args": {"iterations": 20, "restarts": 1},
                "progress": False}
    known = audit(model, (x, y), unseen, start=start, training={"optimizer": "sgd", "lr": 0.1, "weight_decay": 0, "steps": 30},
                  **settings)
    assert ("With the start known, what training added to model.head.0.weight (a layer above the first; W − c·W_start, c = 1 "
            "from the training settings) shows the training inputs' span") in known.reason
    assert "Weights only: no weight layer shows the training inputs' span" in known.reason
    assert known.metrics["layers"]["delta_span_layer"] == "model.head.0.weight"
    alone = audit(model, (x, y), unseen, **settings)
    assert "Weights only: no weight layer shows the training inputs' span: at the closest, model.head.0.weight" in alone.reason
    assert "With the start known" not in alone.reason and alone.verdict == "inconclusive"
