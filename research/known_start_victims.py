"""Prototype victims trained the ordinary way, with their start kept (for ``research/known_start.py``).

Each victim is a folder in the practitioner zoo's layout: ``model.py`` (the class), ``weights.safetensors``
(the trained weights), ``start.safetensors`` (the weights training started from), ``train.npz`` /
``unseen.npz`` (``x`` uint8 images, ``y`` labels), ``training.json`` (the optimiser settings),
``audit.toml`` and, for Adam, ``optimizer_state.safetensors`` (``exp_avg_sq.<name>`` and ``step``).
Plain PyTorch loops: default initialisation with biases, mini-batches, a fixed number of epochs,
inputs normalised by MNIST's (0.1307, 0.3081).

    python research/known_start_victims.py runs/known-start [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from exhume.data import load_bundled_mnist

MODEL_PY = '''import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in=784, hidden=(256, 256), out=1):
        super().__init__()
        layers, prev = [], d_in
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        self.features = nn.Sequential(nn.Flatten(), *layers)
        self.head = nn.Linear(prev, out)

    def forward(self, x):
        return self.head(self.features(x))


class CNN(nn.Module):
    def __init__(self, channels=(16, 32), out=1, batchnorm=False):
        super().__init__()
        c1, c2 = channels
        norm = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), norm(c1), nn.ReLU(), nn.AvgPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), norm(c2), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten())
        self.head = nn.Linear(c2 * 7 * 7, out)

    def forward(self, x):
        return self.head(self.features(x))
'''
MEAN, STD = 0.1307, 0.3081


def _classes():
    ns: dict = {}
    exec(MODEL_PY, ns)  # noqa: S102 - our own source text, written next to the weights
    return ns["MLP"], ns["CNN"]


def split(n: int, n_pre: int, seed: int):
    """Disjoint index sets of the bundled MNIST: training, unseen (1000), pre-training (``n_pre``)."""
    ds = load_bundled_mnist()
    order = np.random.default_rng(seed).permutation(len(ds))
    return ds, order[:n], order[n:n + 1000], order[n + 1000:n + 1000 + n_pre]


def labels_for(y: np.ndarray, task: str) -> torch.Tensor:
    return torch.as_tensor(y % 2 if task == "binary" else y)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, opt: torch.optim.Optimizer, epochs: int,
          batch: int, seed: int) -> int:
    """A tutorial's loop: shuffled mini-batches, BCE-with-logits (one logit) or cross-entropy; returns the steps."""
    gen = torch.Generator().manual_seed(seed)
    lossf = nn.BCEWithLogitsLoss() if task == "binary" else nn.CrossEntropyLoss()
    xn, steps = (x - MEAN) / STD, 0
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            out = model(xn[idx])
            loss = lossf(out[:, 0], y[idx].float()) if task == "binary" else lossf(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    model.eval()
    return steps


def accuracy(model, x, y, task) -> float:
    with torch.no_grad():
        out = model((x - MEAN) / STD)
        pred = (out[:, 0] > 0).long() if task == "binary" else out.argmax(1)
    return float((pred == y).float().mean())


def save(folder: Path, model, start, data, task, settings, opt=None) -> None:
    ds, tr, un = data
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL_PY)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "weights.safetensors"))
    save_file({k: v.detach().contiguous() for k, v in start.items()}, str(folder / "start.safetensors"))
    for name, idx in (("train", tr), ("unseen", un)):
        np.savez(folder / f"{name}.npz", x=(ds.images[idx] * 255).round().astype(np.uint8), y=labels_for(ds.labels[idx], task).numpy())
    if opt is not None and isinstance(opt, torch.optim.Adam):
        names = {id(p): k for k, p in model.named_parameters()}
        state = {f"exp_avg_sq.{names[id(p)]}": s["exp_avg_sq"].contiguous() for p, s in opt.state.items()}
        state["step"] = torch.tensor(float(next(iter(opt.state.values()))["step"]))
        save_file(state, str(folder / "optimizer_state.safetensors"))
    (folder / "training.json").write_text(json.dumps(settings, indent=1) + "\n")
    loss = "logistic" if task == "binary" else "cross-entropy"
    (folder / "audit.toml").write_text(
        f'model = "model.py:{settings["class"]}"\nweights = "weights.safetensors"\ntrain = "train.npz"\nunseen = "unseen.npz"\n'
        f'normalize = "{MEAN},{STD}"\nloss = "{loss}"\nweight_decay = {settings["weight_decay"]}\n'
        f'[model_args]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings["model_args"].items()))


def sgd(params, lr, wd, momentum=0.9):
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)


def build(name: str, out: Path) -> None:
    MLP, CNN = _classes()
    spec = VICTIMS[name]
    task, n, epochs, batch = spec["task"], spec["n"], spec["epochs"], spec["batch"]
    ds, tr, un, pre = split(n, spec.get("n_pre", 0), seed=spec["seed"])
    k = 1 if task == "binary" else 10
    args = {**spec.get("model_args", {}), "out": k}
    cls = CNN if spec["class"] == "CNN" else MLP
    torch.manual_seed(spec["seed"])
    model = cls(**args)
    if spec.get("n_pre"):  # pre-trained on other digits: the public checkpoint
        xp, yp = torch.as_tensor(ds.images[pre]), labels_for(ds.labels[pre], spec.get("pre_task", task))
        pre_model = cls(**{**args, "out": 1 if spec.get("pre_task", task) == "binary" else 10})
        pre_model.load_state_dict({kk: v for kk, v in model.state_dict().items() if kk in pre_model.state_dict()
                                   and v.shape == pre_model.state_dict()[kk].shape}, strict=False)
        train(pre_model, xp, yp, spec.get("pre_task", task), sgd(pre_model.parameters(), 0.01, 5e-4), 20, 64, seed=1)
        own = model.state_dict()
        model.load_state_dict({kk: (v if v.shape == own[kk].shape else own[kk]) for kk, v in pre_model.state_dict().items()})
    start = {kk: v.detach().clone() for kk, v in model.state_dict().items()}
    x, y = torch.as_tensor(ds.images[tr]), labels_for(ds.labels[tr], task)
    params = model.head.parameters() if spec.get("frozen_features") else model.parameters()
    if spec.get("frozen_features"):
        for p in model.features.parameters():
            p.requires_grad_(False)
    opt = (torch.optim.Adam(params, lr=spec["lr"], weight_decay=spec["wd"]) if spec["opt"] == "adam"
           else sgd(params, spec["lr"], spec["wd"], spec.get("momentum", 0.9)))
    steps = train(model, x, y, task, opt, epochs, batch, seed=spec["seed"] + 7)
    settings = {"class": spec["class"], "model_args": args, "optimizer": spec["opt"], "lr": spec["lr"],
                "momentum": None if spec["opt"] == "adam" else spec.get("momentum", 0.9),
                "betas": [0.9, 0.999] if spec["opt"] == "adam" else None, "weight_decay": spec["wd"], "epochs": epochs,
                "batch_size": batch, "n": n, "steps": steps, "task": task, "fine_tuned": bool(spec.get("n_pre")),
                "frozen_features": bool(spec.get("frozen_features")), "train_accuracy": accuracy(model, x, y, task),
                "unseen_accuracy": accuracy(model, torch.as_tensor(ds.images[un]), labels_for(ds.labels[un], task), task)}
    save(out / name, model, start, (ds, tr, un), task, settings, opt)
    print(name, json.dumps({k: settings[k] for k in ("steps", "train_accuracy", "unseen_accuracy")}))


VICTIMS = {
    "mlp-sgd": {"class": "MLP", "task": "binary", "n": 200, "epochs": 100, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4, "seed": 0},
    "mlp-ft": {"class": "MLP", "task": "binary", "n": 100, "epochs": 50, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4, "seed": 1,
               "n_pre": 2000},
    "mlp-adam10": {"class": "MLP", "task": "multiclass", "n": 200, "epochs": 100, "batch": 64, "opt": "adam", "lr": 1e-3, "wd": 0.0,
                   "seed": 2},
    "head-frozen": {"class": "MLP", "task": "multiclass", "n": 200, "epochs": 100, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4,
                    "seed": 3, "n_pre": 2000, "pre_task": "binary", "frozen_features": True},
    "cnn-ft": {"class": "CNN", "task": "binary", "n": 100, "epochs": 50, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4, "seed": 4,
               "n_pre": 2000, "model_args": {"channels": [16, 32]}},
    "cnn": {"class": "CNN", "task": "binary", "n": 100, "epochs": 50, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4, "seed": 5,
            "model_args": {"channels": [16, 32]}},
    "cnn-bn": {"class": "CNN", "task": "binary", "n": 100, "epochs": 50, "batch": 32, "opt": "sgd", "lr": 0.01, "wd": 5e-4, "seed": 5,
               "model_args": {"channels": [16, 32], "batchnorm": True}},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(VICTIMS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.only or VICTIMS:
        build(name, args.out)


if __name__ == "__main__":
    main()
