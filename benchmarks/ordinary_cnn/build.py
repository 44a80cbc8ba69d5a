"""Build the ordinary-CNN zoo: 28×28 CNNs trained the way tutorials train them, saved as exhume victim folders.

    python benchmarks/ordinary_cnn/build.py OUT [--only NAME ...]
    python benchmarks/ordinary_cnn/build.py OUT --table          # the victim table (markdown) from OUT

Each victim is trained by a plain PyTorch loop (no exhume trainer): PyTorch's default initialisation (biases
everywhere), ``torch.optim.SGD(momentum=0.9)`` or ``torch.optim.Adam`` with ``weight_decay=5e-4``, shuffled
mini-batches from a seeded ``DataLoader``, a fixed number of epochs; not to a stationary point. The model is
exhume's CNN from an architecture spec (so ``victim.json`` describes it and ``exhume attack`` / ``exhume evaluate
--pool-size 1000`` read the folder as they read any victim); the training images are exhume's task selection
(``select_task``, seeded), fed centred by their mean (exhume's convention; a tutorial's ``Normalize`` would also
divide by a std, a rescaling of the first layer). One thread, seeded: the same files on every run.

``OUT/<name>/`` is an exhume victim folder: ``victim.json`` (``train_config`` records the loop), ``model.safetensors``,
``train_indices.npy``, ``start.safetensors`` (the weights training started from: the owner's initialisation or the
public pre-trained checkpoint with the new layers' initialisation), plus ``training.json`` (the settings an owner
knows, for ``--train-*``) and, for Adam, ``optimizer_state.safetensors`` (``exp_avg_sq.<name>`` and ``step``).

The public start of the fine-tuned and frozen-extractor victims is the recipe architecture trained on Fashion-MNIST's
*test* split (10 classes): disjoint from every victim's training images and from the pool and control that
``exhume evaluate`` draws from the training split.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: exhume without installing

RECIPE = "cnn:16;fc=256;pool=avg;bias=all"  # the recipe's architecture (docs/METHODS.md §5) with PyTorch's biases
TUTORIAL = "cnn:16,32;fc=128;pool=max;bias=all"  # two convolutions, max-pooling, a hidden fc layer


@dataclass(frozen=True)
class Spec:
    """One victim (or the pre-training of the public start)."""

    name: str
    data: str  # mnist | fashion-mnist
    task: str  # odd-even | multiclass
    arch: str
    optimizer: str = "sgd"  # sgd (momentum 0.9) | adam
    lr: float = 0.01
    weight_decay: float = 5e-4
    batch: int = 32
    epochs: int = 60
    n: int = 100
    seed: int = 0
    pretrained: bool = False  # start from the public checkpoint (PUBLIC), its output layer replaced when shapes differ
    freeze: str | None = None  # parameters whose names start with this stay at the start (a frozen extractor)
    split: str = "train"


#: the public checkpoint: the recipe architecture on Fashion-MNIST's test split, 10 classes, Adam, 3 epochs
PUBLIC = Spec("public-fashion-cnn", "fashion-mnist", "multiclass", RECIPE, "adam", 1e-3, 0.0, 128, 3, 10_000, seed=100,
              split="test")

ZOO = (
    Spec("mnist-recipe-sgdm", "mnist", "odd-even", RECIPE, "sgd", 0.01, epochs=60, seed=1),
    Spec("mnist-recipe-adam", "mnist", "odd-even", RECIPE, "adam", 1e-3, epochs=60, seed=2),
    Spec("mnist-tutorial-sgdm", "mnist", "odd-even", TUTORIAL, "sgd", 0.01, epochs=60, seed=3),
    Spec("fashion-recipe-sgdm", "fashion-mnist", "odd-even", RECIPE, "sgd", 0.01, epochs=60, seed=4),
    Spec("mnist-recipe10-sgdm", "mnist", "multiclass", RECIPE, "sgd", 0.01, epochs=30, n=500, seed=5),
    Spec("fashion-tutorial10-adam", "fashion-mnist", "multiclass", TUTORIAL, "adam", 1e-3, epochs=30, n=500, seed=6),
    Spec("mnist-recipe-finetune", "mnist", "odd-even", RECIPE, "sgd", 0.01, epochs=30, seed=7, pretrained=True),
    Spec("mnist-frozen-head", "mnist", "odd-even", RECIPE, "sgd", 0.01, epochs=60, seed=8, pretrained=True,
         freeze="features."),
)
BY_NAME = {s.name: s for s in ZOO}


def task_data(spec: Spec):
    """The training images of ``spec`` (exhume's seeded task selection) and the dataset they come from."""
    from exhume.data import load_dataset, select_task

    ds = load_dataset(spec.data, split=spec.split)
    return ds, select_task(ds, spec.task, spec.n, seed=spec.seed)


def new_model(spec: Spec, input_shape, classes: int | None):
    from exhume.data.tasks import out_features
    from exhume.models import build_model, parse_arch

    torch.manual_seed(spec.seed)
    kind = "binary" if spec.task == "odd-even" else "multiclass"
    return build_model(parse_arch(spec.arch), tuple(input_shape), out_features(kind, classes))


def make_optimizer(spec: Spec, params):
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay)
    return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)


def loss_name(spec: Spec) -> str:
    return "logistic" if spec.task == "odd-even" else "cross-entropy"


def fit(spec: Spec, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.optim.Optimizer, int, float]:
    """The plain loop: ``spec.epochs`` epochs of shuffled mini-batches; returns (optimizer, steps, final mean loss)."""
    from torch.utils.data import DataLoader, TensorDataset

    from exhume.losses import per_sample_loss

    opt = make_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    loader = DataLoader(TensorDataset(x, y), batch_size=spec.batch, shuffle=True, generator=torch.Generator().manual_seed(spec.seed))
    steps = 0
    model.train()
    for _ in range(spec.epochs):
        for xb, yb in loader:
            opt.zero_grad()
            per_sample_loss(loss_name(spec), model(xb), yb).mean().backward()
            opt.step()
            steps += 1
    model.eval()
    with torch.no_grad():
        final = float(per_sample_loss(loss_name(spec), model(x), y).mean())
    return opt, steps, final


def public_start(out: Path) -> dict[str, torch.Tensor]:
    """The public checkpoint (trained once, cached in ``OUT/public-fashion-cnn.safetensors``)."""
    from safetensors.torch import load_file, save_file

    path = out / f"{PUBLIC.name}.safetensors"
    if path.is_file():
        return load_file(str(path))
    ds, td = task_data(PUBLIC)
    model = new_model(PUBLIC, td.x.shape[1:], 10)
    t0 = time.perf_counter()
    _, steps, final = fit(PUBLIC, model, td.centred, td.y)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    (out / f"{PUBLIC.name}.json").write_text(json.dumps({**asdict(PUBLIC), "steps": steps, "final_loss": final,
                                                         "seconds": round(time.perf_counter() - t0, 2)}, indent=1))
    return state


def start_model(spec: Spec, model: torch.nn.Module, out: Path) -> None:
    """Load the public checkpoint over the owner's initialisation (tensors of the same shape only: a new output layer
    keeps its initialisation) and freeze ``spec.freeze``."""
    if spec.pretrained:
        own = model.state_dict()
        public = {k: v for k, v in public_start(out).items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(public, strict=False)
    if spec.freeze:
        for k, p in model.named_parameters():
            if k.startswith(spec.freeze):
                p.requires_grad_(False)


def adam_state(opt: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    names = {id(p): k for k, p in model.named_parameters()}
    out = {f"exp_avg_sq.{names[id(p)]}": s["exp_avg_sq"].detach().clone().contiguous() for p, s in opt.state.items()}
    out["step"] = torch.tensor(float(next(iter(opt.state.values()))["step"]))
    return out


def owner_settings(spec: Spec, steps: int) -> dict:
    """What the owner knows of training (exhume's ``training=`` / ``--train-*``)."""
    out = {"optimizer": spec.optimizer, "lr": spec.lr, "weight_decay": spec.weight_decay, "steps": steps}
    if spec.optimizer == "sgd":
        out["momentum"] = 0.9
    return out


def build_victim(spec: Spec, out: Path) -> dict:
    """Train ``spec`` and write ``OUT/<name>/`` (see the module docstring); returns training.json's content."""
    from safetensors.torch import save_file

    from exhume.data import select_pool
    from exhume.evaluation.layers import layer_diagnostics
    from exhume.models import parse_arch
    from exhume.victim import Victim
    from exhume.victim.build import accuracy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ds, td = task_data(spec)
        kind = td.task
        classes = 10 if kind == "multiclass" else None
        model = new_model(spec, td.x.shape[1:], classes)
        start_model(spec, model, out)
        start = {k: v.detach().clone().contiguous() for k, v in model.named_parameters()}
        t0 = time.perf_counter()
        opt, steps, final = fit(spec, model, td.centred, td.y)
        seconds = time.perf_counter() - t0
        test = select_pool(ds, spec.task, 1000, exclude=np.asarray(td.indices), seed=spec.seed + 12345)
        metrics = {"final_loss": final, "train_accuracy": accuracy(model, td.centred, td.y, kind),
                   "test_accuracy": accuracy(model, test.x - td.mean, test.y, kind), "test_size": len(test),
                   "seconds": round(seconds, 2), "steps": steps, "epochs": spec.epochs, "stop_reason": "max_epochs"}
        metrics["layers"] = layer_diagnostics(model, td.centred.float(), spec.n)
    finally:
        torch.set_num_threads(threads)
    settings = owner_settings(spec, steps)
    train_config = {"trainer": "plain PyTorch loop (benchmarks/ordinary_cnn/build.py)", **asdict(spec), "momentum":
                    0.9 if spec.optimizer == "sgd" else None, "loss": loss_name(spec), "shuffle": True,
                    "public_start": PUBLIC.name if spec.pretrained else None}
    victim = Victim(model=model.float().eval(), task=kind, input_shape=tuple(td.x.shape[1:]), mean=td.mean, loss=loss_name(spec),
                    weight_decay=spec.weight_decay, num_classes=classes, arch=parse_arch(spec.arch), train_config=train_config,
                    metrics=metrics, data_spec=td.spec, train_indices=np.asarray(td.indices), start=start)
    folder = out / spec.name
    victim.save(folder)
    (folder / "training.json").write_text(json.dumps(settings, indent=1))
    if spec.optimizer == "adam":
        save_file(adam_state(opt, model), str(folder / "optimizer_state.safetensors"))
    return {**settings, **{k: metrics[k] for k in ("train_accuracy", "test_accuracy", "seconds", "final_loss")}}


def table(out: Path) -> str:
    """The victim table (markdown) from the victims in ``out``: training, accuracy, and each weight layer's
    σ_{n+1}/σ_1 of W (attacker-side)."""
    head = ("| victim | data, task, n | arch | optimizer, lr, wd | batch × epochs (steps) | train / test acc | train s |\n"
            "|---|---|---|---|---|---|---|\n")
    rows = []
    for s in ZOO:
        p = out / s.name / "victim.json"
        if not p.is_file():
            continue
        m = json.loads(p.read_text())["metrics"]
        opt = "SGD m0.9" if s.optimizer == "sgd" else "Adam"
        start = (" (public start" + (", features frozen" if s.freeze else "") + ")") if s.pretrained else ""
        rows.append(f"| {s.name} | {s.data} {s.task} {s.n} | `{s.arch}`{start} | {opt}, {s.lr:g}, {s.weight_decay:g} "
                    f"| {s.batch} × {s.epochs} ({m['steps']}) | {m['train_accuracy']:.3f} / {m['test_accuracy']:.3f} "
                    f"| {m['seconds']:.1f} |")
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", nargs="+", default=None, help="build these victims only")
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
        info = build_victim(spec, out)
        print(f"{spec.name}: {info['steps']} steps in {info['seconds']:.1f} s, train {info['train_accuracy']:.3f}, "
              f"test {info['test_accuracy']:.3f}, loss {info['final_loss']:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["BY_NAME", "PUBLIC", "RECIPE", "TUTORIAL", "ZOO", "Spec", "build_victim", "replace"]
