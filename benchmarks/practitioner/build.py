"""Build the practitioner zoo: victims trained by plain PyTorch loops, saved as a user would save them.

    python benchmarks/practitioner/build.py OUT [--only NAME ...] [--fashion-root DIR]
    python benchmarks/practitioner/build.py OUT --table        # the victim table (markdown) from OUT

Each victim is trained the way tutorials train models (PyTorch's default initialisation with
biases, ``torch.optim.SGD``/``Adam``, shuffled mini-batches from a ``DataLoader``, a fixed number of
epochs: not ``exhume train``, not to stationarity), on one thread, seeded: the same files on every
run. ``OUT/<name>/`` holds ``models.py`` (a copy of the classes), ``weights.safetensors`` (final),
``start.safetensors`` (what training started from: the owner's initialisation, or the public
pre-trained checkpoint), ``train.npz`` (x, y), ``unseen.npz`` (x and, for the evaluator, y),
``audit.toml`` (``exhume audit --config OUT/<name>/audit.toml``), ``training.json`` (everything the
owner knows), ``optimizer_state.safetensors`` for Adam victims (``exp_avg_sq`` keyed by parameter
name) and ``pretrain.json`` for victims that start from pre-trained weights. When every victim of
:data:`ZOO` is complete, ``OUT/READY`` lists them.

The data blocks (pre-train / train / unseen, disjoint) are in :mod:`practitioner.data`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: exhume and exhume_benchmarks.practitioner without installing

from exhume_benchmarks.practitioner import data, models  # noqa: E402

FILES = ("models.py", "weights.safetensors", "start.safetensors", "train.npz", "unseen.npz", "audit.toml", "training.json")


@dataclass
class Spec:
    """One training run: a victim, or the pre-training that made its public start."""

    name: str
    data: str  # mnist | fashion | digits
    task: str  # odd-even | 10-class
    model: str  # a class of models.py
    model_args: dict = field(default_factory=dict)
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.01
    momentum: float = 0.0
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    batch: int | None = 64  # None: full batch, no shuffling
    epochs: int = 100
    n: int = 200  # training images (pre-training: images of the pre-train block)
    seed: int = 0
    unseen: int | None = None  # unseen images; None: n + 1000
    pretrain: Spec | None = None  # the run that made the public start
    transfer: tuple = ()  # (pre-trained key prefix, victim key prefix) pairs; () = the whole state dict
    freeze: str | None = None  # parameters whose names start with this are frozen (requires_grad False)
    split: str = "blocks"  # blocks (practitioner.data) | readme (the README's idx[:100], idx[100:1100])


_TRUNK = (("features.", "trunk.0."),)  # the pre-trained CNN's convolutional part
_MNIST_PRE = Spec("pretrain-mnist-cnn", "mnist", "10-class", "CNN", {"c1": 8, "c2": 16, "hidden": 64, "outputs": 10},
                  "adam", 1e-3, batch=128, epochs=5, n=8000, seed=100)
_FASHION_PRE = replace(_MNIST_PRE, name="pretrain-fashion-cnn", data="fashion", n=10_000, seed=101)
_MLP10 = {"in_features": 784, "widths": [256, 128], "outputs": 10}

ZOO = (
    Spec("readme-example", "mnist", "odd-even", "Net", {"hidden": 300, "second": 100}, "sgd", 0.05, weight_decay=5e-4,
         batch=None, epochs=3000, n=100, seed=0, unseen=1000, split="readme"),
    Spec("mnist-mlp-binary-sgdm", "mnist", "odd-even", "MLP", {"in_features": 784, "widths": [256, 128], "outputs": 1},
         "sgd", 0.01, momentum=0.9, weight_decay=5e-4, batch=32, epochs=100, n=200, seed=1),
    Spec("mnist-mlp10-adam", "mnist", "10-class", "MLP", _MLP10, "adam", 1e-3, weight_decay=5e-4, batch=64, epochs=100,
         n=300, seed=2),
    Spec("fashion-cnn-sgdm", "fashion", "10-class", "CNN", {"c1": 16, "c2": 32, "hidden": 64, "outputs": 10}, "sgd", 0.02,
         momentum=0.9, weight_decay=5e-3, batch=64, epochs=60, n=300, seed=3),
    Spec("digits-bncnn-adam", "digits", "10-class", "BNCNN", {"size": 8, "c1": 8, "c2": 16, "hidden": 64, "outputs": 10},
         "adam", 2e-3, weight_decay=5e-3, batch=32, epochs=150, n=300, seed=4),
    Spec("digits-mlp-binary-nowd", "digits", "odd-even", "MLP", {"in_features": 64, "widths": [128, 128], "outputs": 1},
         "sgd", 0.05, momentum=0.9, weight_decay=0.0, batch=32, epochs=300, n=200, seed=5),
    Spec("fashion-mlp-binary-adam", "fashion", "odd-even", "MLP", {"in_features": 784, "widths": [128], "outputs": 1},
         "adam", 1e-3, weight_decay=5e-3, batch=128, epochs=200, n=500, seed=6),
    Spec("mnist-mlp-finetune", "mnist", "10-class", "MLP", _MLP10, "sgd", 0.01, momentum=0.9, weight_decay=5e-4, batch=32,
         epochs=50, n=200, seed=7, pretrain=replace(_MNIST_PRE, name="pretrain-mnist-mlp", model="MLP", model_args=_MLP10)),
    Spec("fashion-cnn-finetune", "fashion", "10-class", "CNN", {"c1": 8, "c2": 16, "hidden": 64, "outputs": 10}, "adam", 3e-4,
         weight_decay=5e-4, batch=64, epochs=50, n=200, seed=8, pretrain=_FASHION_PRE),
    Spec("fashion-cnn-finetune-sgdm", "fashion", "10-class", "CNN", {"c1": 8, "c2": 16, "hidden": 64, "outputs": 10}, "sgd",
         0.01, momentum=0.9, weight_decay=5e-4, batch=32, epochs=50, n=200, seed=11, pretrain=_FASHION_PRE),
    Spec("mnist-frozen-head", "mnist", "odd-even", "FrozenTrunkHead", {"head_hidden": 128, "outputs": 1}, "sgd", 0.01,
         momentum=0.9, weight_decay=5e-4, batch=64, epochs=100, n=200, seed=9, pretrain=_MNIST_PRE, transfer=_TRUNK,
         freeze="trunk."),
    Spec("fashion-frozen-linear", "fashion", "10-class", "FrozenTrunkHead", {"head_hidden": 0, "outputs": 10}, "adam", 1e-3,
         weight_decay=5e-3, batch=32, epochs=100, n=100, seed=10, pretrain=_FASHION_PRE, transfer=_TRUNK, freeze="trunk."),
)
#: the counting argument's test (benchmarks/notes/2026-11-27-known-start-identifiability.md): two victims of the
#: zoo that nothing leaked from, trained the same way on 40 images, so that their trained parameters outnumber the pixels
#: of their training images; built with --only, not part of READY
SMALL_N = (replace(ZOO[9], name="fashion-cnn-finetune-sgdm-n40", n=40), replace(ZOO[10], name="mnist-frozen-head-n40", n=40))
BY_NAME = {s.name: s for s in ZOO + SMALL_N}


def indices(spec: Spec) -> dict[str, np.ndarray]:
    """The dataset indices of ``spec``'s training, unseen and (when it has one) pre-training images."""
    if spec.split == "readme":  # the README's script: idx = default_rng(0).permutation(len(ds)); idx[:100], idx[100:1100]
        idx = np.random.default_rng(0).permutation(len(data.dataset(spec.data)[0]))
        out = {"train": idx[:spec.n], "unseen": idx[spec.n:spec.n + (spec.unseen or 1000)]}
    else:
        b = data.blocks(spec.data)
        n_unseen = spec.n + 1000 if spec.unseen is None else spec.unseen
        if spec.n > len(b["train"]) or n_unseen > len(b["unseen"]):
            raise ValueError(f"{spec.name}: n = {spec.n} and {n_unseen} unseen images exceed the {spec.data} blocks "
                             f"({len(b['train'])} and {len(b['unseen'])})")
        out = {"train": b["train"][:spec.n], "unseen": b["unseen"][:n_unseen]}
        if spec.pretrain is not None:
            out["pretrain"] = b["pretrain"][:spec.pretrain.n]
    data.check_disjoint(**out)
    return out


def arrays(spec: Spec, idx: np.ndarray, fashion_root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Display-space images (float32 in [0, 1]) and task labels of the dataset images ``idx``."""
    images, labels = data.dataset(spec.data, fashion_root)
    return images[idx], data.labels_for(spec.task, labels[idx])


def model_inputs(spec: Spec, x: np.ndarray) -> torch.Tensor:
    """``(x − mean) / std`` as the training loop feeds it (raw pixels when the dataset's normalisation is none)."""
    norm = data.NORMALIZE[spec.data]
    xt = torch.from_numpy(x)
    return xt if norm == "none" else (xt - norm[0]) / norm[1]


def loss_of(spec: Spec, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """BCE-with-logits on the one logit (binary) or cross-entropy (10 classes), as the user's script computes it."""
    if spec.task == "odd-even":
        return torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), y.float())
    return torch.nn.functional.cross_entropy(out, y)


def make_optimizer(spec: Spec, params) -> torch.optim.Optimizer:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, betas=tuple(spec.betas), weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}; expected sgd or adam")


def fit(spec: Spec, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.optim.Optimizer, int]:
    """The plain loop: ``spec.epochs`` epochs of shuffled mini-batches (seeded), or full-batch steps; returns (optimizer, steps)."""
    from torch.utils.data import DataLoader, TensorDataset

    opt = make_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    if spec.batch is None:
        batches = [(x, y)]
    else:
        batches = DataLoader(TensorDataset(x, y), batch_size=spec.batch, shuffle=True,
                             generator=torch.Generator().manual_seed(spec.seed))
    steps = 0
    model.train()
    for _ in range(spec.epochs):
        for xb, yb in batches:
            opt.zero_grad()
            loss_of(spec, model(xb), yb).backward()
            opt.step()
            steps += 1
    model.eval()
    return opt, steps


def accuracy(spec: Spec, model: torch.nn.Module, x: torch.Tensor, y: np.ndarray) -> float:
    with torch.no_grad():
        out = model.eval()(x)
    pred = (out.squeeze(1) > 0).long() if spec.task == "odd-even" else out.argmax(1)
    return float((pred.numpy() == y).mean())


def new_model(spec: Spec) -> torch.nn.Module:
    """``torch.manual_seed(seed)`` then ``Class(**model_args)``: the owner's initialisation."""
    torch.manual_seed(spec.seed)
    return getattr(models, spec.model)(**spec.model_args)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def run_pretrain(spec: Spec, pre_idx: np.ndarray, fashion_root: str | None) -> tuple[dict, dict]:
    """Train the public checkpoint on the pre-train images; returns (its state dict, pretrain.json's content)."""
    t0 = time.perf_counter()
    x, y = arrays(spec, pre_idx, fashion_root)
    xt = model_inputs(spec, x)
    model = new_model(spec)
    _, steps = fit(spec, model, xt, torch.from_numpy(y))
    info = {"what": "the public pre-trained checkpoint this victim starts from (its images are disjoint from train.npz and "
                    "unseen.npz; the attacker has them too)",
            **describe(spec), "steps": steps, "indices": pre_idx.tolist(), "accuracy_on_pretrain_images": accuracy(spec, model, xt, y),
            "seconds": round(time.perf_counter() - t0, 2)}
    return state(model), info


def start_model(spec: Spec, pre_state: dict | None) -> torch.nn.Module:
    """The victim before training: the owner's initialisation, with the pre-trained weights loaded (or mapped by
    ``transfer``) over it, and the ``freeze`` parameters frozen."""
    model = new_model(spec)
    if pre_state is not None:
        if spec.transfer:
            mapped = {dst + k[len(src):]: v for k, v in pre_state.items() for src, dst in spec.transfer if k.startswith(src)}
            missing = [k for k in mapped if k not in model.state_dict()]
            if missing:
                raise KeyError(f"{spec.name}: transfer maps to unknown keys {missing[:3]}")
            model.load_state_dict(mapped, strict=False)
        else:
            model.load_state_dict(pre_state)
    if spec.freeze:
        for name, p in model.named_parameters():
            if name.startswith(spec.freeze):
                p.requires_grad_(False)
    return model


def describe(spec: Spec) -> dict:
    """The settings of a run, as the owner knows them."""
    return {"name": spec.name, "data": spec.data, "data_source": data.SOURCE[spec.data], "task": spec.task,
            "labels": "1 = odd digit / odd class id, 0 = even" if spec.task == "odd-even" else "class ids 0..9",
            "normalize": data.NORMALIZE[spec.data], "model": spec.model, "model_args": spec.model_args,
            "optimizer": {"name": spec.optimizer, "lr": spec.lr, "weight_decay": spec.weight_decay,
                          **({"momentum": spec.momentum, "dampening": 0.0, "nesterov": False} if spec.optimizer == "sgd"
                             else {"betas": list(spec.betas), "eps": 1e-8, "amsgrad": False})},
            "loss": "BCE-with-logits on one logit" if spec.task == "odd-even" else "cross-entropy",
            "batch_size": spec.batch, "shuffle": spec.batch is not None, "drop_last": False, "epochs": spec.epochs,
            "seed": spec.seed, "n": spec.n, "threads": 1, "torch": torch.__version__}


def adam_state(opt: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``exp_avg_sq`` of every trained parameter, keyed by its name."""
    names = {id(p): k for k, p in model.named_parameters()}
    return {names[id(p)]: s["exp_avg_sq"].detach().clone().contiguous() for p, s in opt.state.items()}


def build_victim(spec: Spec, out: str | Path, fashion_root: str | None = None) -> dict:
    """Train ``spec`` and write ``out/<name>/`` (see the module docstring); returns training.json's content."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float results on every machine load
    try:
        idx = indices(spec)
        pre_state = pre_info = None
        if spec.pretrain is not None:
            pre_state, pre_info = run_pretrain(spec.pretrain, idx["pretrain"], fashion_root)
        x, y = arrays(spec, idx["train"], fashion_root)
        ux, uy = arrays(spec, idx["unseen"], fashion_root)
        xt, uxt = model_inputs(spec, x), model_inputs(spec, ux)
        t0 = time.perf_counter()
        model = start_model(spec, pre_state)
        start = state(model)
        opt, steps = fit(spec, model, xt, torch.from_numpy(y))
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    frozen = [k for k, p in model.named_parameters() if not p.requires_grad]
    info = {**describe(spec), "steps": steps, "n_unseen": len(ux), "train_accuracy": accuracy(spec, model, xt, y),
            "test_accuracy": accuracy(spec, model, uxt, uy), "test_accuracy_on": "the unseen images (never trained on)",
            "train_seconds": round(seconds, 2), "pretrain_seconds": None if pre_info is None else pre_info["seconds"],
            "parameters": sum(p.numel() for p in model.parameters()),
            "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad), "frozen": frozen,
            "start": ("the public pre-trained checkpoint (pretrain.json)" + (", its mapped trunk with the owner's head init"
                      if spec.transfer else "") if pre_info else f"the owner's initialisation: torch.manual_seed({spec.seed}) "
                      f"then {spec.model}(**model_args)"),
            "split": {"rule": "README: idx = default_rng(0).permutation(10000), train idx[:100], unseen idx[100:1100]"
                      if spec.split == "readme" else data.BLOCKS_TEXT[spec.data],
                      "train_indices": idx["train"].tolist(), "unseen_indices": idx["unseen"].tolist(),
                      "pretrain_indices": "pretrain.json" if pre_info else None, "disjoint": True}}
    folder = Path(out) / spec.name
    write_files(folder, spec, model, start, (x, y), (ux, uy), info)
    if spec.optimizer == "adam":
        save_tensors(adam_state(opt, model), folder / "optimizer_state.safetensors")
    if pre_info is not None:
        (folder / "pretrain.json").write_text(json.dumps(pre_info, indent=1))
    return info


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def audit_toml(spec: Spec) -> str:
    """``exhume audit --config`` settings that audit the victim exactly as a user's model (paths relative to the file)."""
    norm = data.NORMALIZE[spec.data]
    settings = {"model": f"models.py:{spec.model}", "weights": "weights.safetensors", "train": "train.npz",
                "unseen": "unseen.npz", "normalize": "none" if norm == "none" else f"{norm[0]},{norm[1]}",
                "loss": "logistic" if spec.task == "odd-even" else "cross-entropy", "weight_decay": spec.weight_decay,
                "out": "audit"}
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    lines += ["", "[model_args]"] + [f"{k} = {json.dumps(v)}" for k, v in spec.model_args.items()]
    return "\n".join(lines) + "\n"


def write_files(folder: Path, spec: Spec, model, start: dict, train: tuple, unseen: tuple, info: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "models.py", folder / "models.py")
    save_tensors(state(model), folder / "weights.safetensors")
    save_tensors(start, folder / "start.safetensors")
    np.savez(folder / "train.npz", x=train[0], y=train[1])
    np.savez(folder / "unseen.npz", x=unseen[0], y=unseen[1])
    (folder / "audit.toml").write_text(audit_toml(spec))
    (folder / "training.json").write_text(json.dumps(info, indent=1))


def complete(folder: Path, spec: Spec) -> bool:
    """Whether ``folder`` holds every file of ``spec``'s victim."""
    need = list(FILES) + (["optimizer_state.safetensors"] if spec.optimizer == "adam" else []) \
        + (["pretrain.json"] if spec.pretrain is not None else [])
    return all((folder / f).is_file() for f in need)


def write_ready(out: Path) -> bool:
    """Write ``out/READY`` (the victims, one a line) when every victim of :data:`ZOO` is complete."""
    if not all(complete(out / s.name, s) for s in ZOO):
        return False
    (out / "READY").write_text("".join(f"{s.name}\n" for s in ZOO))
    return True


def table(out: Path) -> str:
    """The victim table (markdown) from the ``training.json`` files in ``out``."""
    head = ("| victim | data | model | params (trained) | optimizer | lr | wd | batch | epochs | steps | n | train / test acc "
            "| train s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for s in ZOO:
        p = out / s.name / "training.json"
        if not p.is_file():
            continue
        t = json.loads(p.read_text())
        o = t["optimizer"]
        opt = f"SGD m{o['momentum']:g}" if o["name"] == "sgd" else "Adam"
        args = ",".join(f"{k}={v}" for k, v in t["model_args"].items()).replace(" ", "")
        pre = f" + pre-train {t['pretrain_seconds']:.0f} s" if t.get("pretrain_seconds") else ""
        rows.append(f"| {s.name} | {t['data']} {t['task']} | {t['model']}({args}) | {t['parameters']:,} "
                    f"({t['trained_parameters']:,}) | {opt} | {o['lr']:g} | {o['weight_decay']:g} | {t['batch_size'] or 'full'} "
                    f"| {t['epochs']} | {t['steps']} | {t['n']} | {t['train_accuracy']:.3f} / {t['test_accuracy']:.3f} "
                    f"| {t['train_seconds']:.1f}{pre} |")
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", nargs="+", default=None, help="build these victims only")
    ap.add_argument("--fashion-root", default=None, help="Fashion-MNIST IDX folder (default Debian's)")
    ap.add_argument("--table", action="store_true", help="print the victim table of OUT and exit")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.table:
        print(table(out), end="")
        return 0
    unknown = [n for n in args.only or [] if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown victim(s) {unknown}; known: {', '.join(BY_NAME)}")
    for spec in [BY_NAME[n] for n in args.only] if args.only else ZOO:
        info = build_victim(spec, out, args.fashion_root)
        print(f"{spec.name}: {info['steps']} steps in {info['train_seconds']:.1f} s, train {info['train_accuracy']:.3f}, "
              f"test {info['test_accuracy']:.3f}", flush=True)
    if write_ready(out):
        print(f"all {len(ZOO)} victims complete: {out / 'READY'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
