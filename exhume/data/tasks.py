"""Turn an :class:`ImageDataset` into a victim's training task: a balanced, reproducible selection
of ``n`` images with binary (+1/-1) or multiclass labels, plus disjoint pools of unseen images.

The three task kinds are defined here, once: ``binary`` (labels ±1, one output), ``multiclass``
(class ids, one output per class) and ``regression`` (a multiclass selection whose targets are
the class ids mapped onto [−1, 1], one output). :func:`task_kind` names the kind of a task
string, :data:`DEFAULT_LOSS` and :func:`check_task_loss` say which losses fit it,
:func:`out_features` how many outputs the network has, and :func:`select_task` /
:func:`select_pool` draw a training set or a pool of any kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from exhume.data.datasets import ImageDataset, load_dataset
from exhume.errors import ConfigError, DataError

#: Binary presets: (positive classes -> +1, negative classes -> -1).
PRESETS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "odd-even": ((1, 3, 5, 7, 9), (0, 2, 4, 6, 8)),
    "vehicles-animals": ((0, 1, 8, 9), (2, 3, 4, 5, 6, 7)),
}
TASK_HELP = ("'odd-even', 'vehicles-animals', 'multiclass' (every class), 'multiclass:0,1,2' (those classes, "
             "labelled 0, 1, 2 in that order), or a split of class ids such as '1,3,5/0,2,4' (first group +1, second -1)")

TASK_KINDS = ("binary", "multiclass", "regression")
#: The training loss each kind uses unless told otherwise.
DEFAULT_LOSS = {"binary": "logistic", "multiclass": "cross-entropy", "regression": "squared"}


def task_kind(task: str) -> str:
    """The kind (one of :data:`TASK_KINDS`) of a task string such as ``odd-even``, ``1,3/0,2``,
    ``multiclass`` or ``regression``; an unknown task is refused."""
    if isinstance(task, str) and task.strip().lower() == "regression":
        return "regression"
    return parse_task(task)[0]


def check_task_loss(kind: str, loss: str) -> None:
    """Refuse a training loss that does not fit the task kind."""
    if kind == "multiclass" and loss == "logistic":
        raise ConfigError("a multiclass task needs loss 'cross-entropy' (or 'squared'), not 'logistic'")
    if kind == "regression" and loss != "squared":
        raise ConfigError(f"a regression task needs loss 'squared', not {loss!r}")
    if kind == "binary" and loss == "cross-entropy":
        raise ConfigError("a binary task (labels ±1, one output) needs loss 'logistic' or 'squared', not 'cross-entropy'")


def out_features(kind: str, num_classes: int | None) -> int:
    """The network's number of outputs for a task kind: one per class for multiclass, else one."""
    return int(num_classes) if kind == "multiclass" else 1


@dataclass
class TaskData:
    x: torch.Tensor  # (n, C, H, W) float32 display space [0, 1]
    y: torch.Tensor  # binary: float32 in {-1., +1.}; multiclass: int64 class ids
    classes: np.ndarray  # original class id of each sample, (n,)
    indices: np.ndarray  # int64 indices into the source ImageDataset, (n,)
    mean: torch.Tensor  # (C, H, W): mean of x; the victim is trained on x - mean
    task: str  # "binary" or "multiclass"
    spec: dict  # JSON-serialisable: enough to rebuild with rebuild_task

    @property
    def centred(self) -> torch.Tensor:
        return self.x - self.mean

    def __len__(self) -> int:
        return int(self.x.shape[0])


def _parse_group(text: str, task: str) -> tuple[int, ...]:
    items = [t.strip() for t in text.split(",")]
    if not items or any(t == "" for t in items):
        raise ConfigError(f"task {task!r}: empty class id in group {text!r}; expected e.g. {TASK_HELP}")
    try:
        ids = tuple(int(t) for t in items)
    except ValueError:
        raise ConfigError(f"task {task!r}: class ids must be integers, got group {text!r}") from None
    if any(i < 0 for i in ids):
        raise ConfigError(f"task {task!r}: class ids must be >= 0, got group {text!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"task {task!r}: group {text!r} repeats a class id")
    return ids


def parse_task(task: str):
    """Return ``("binary", (positive_ids, negative_ids))``, ``("multiclass", None)`` (every class) or
    ``("multiclass", (ids,))`` for ``multiclass:ids`` (class ``ids[k]`` gets label ``k``)."""
    if not isinstance(task, str):
        raise ConfigError(f"task must be a string, got {type(task).__name__}; expected {TASK_HELP}")
    key = task.strip().lower()
    if key == "multiclass":
        return "multiclass", None
    if key.startswith("multiclass:"):
        ids = _parse_group(key.split(":", 1)[1], task)
        if len(ids) < 2:
            raise ConfigError(f"task {task!r}: a multiclass task needs at least two classes")
        return "multiclass", (ids,)
    if key in PRESETS:
        return "binary", PRESETS[key]
    if "/" not in key:
        raise ConfigError(f"unknown task {task!r}; expected {TASK_HELP}")
    parts = key.split("/")
    if len(parts) != 2:
        raise ConfigError(f"task {task!r}: expected exactly two groups separated by one '/'")
    pos, neg = _parse_group(parts[0], task), _parse_group(parts[1], task)
    overlap = sorted(set(pos) & set(neg))
    if overlap:
        raise ConfigError(f"task {task!r}: the two groups must be disjoint, both contain {overlap}")
    return "binary", (pos, neg)


def _allocate(counts: dict[int, int], m: int, rng: np.random.Generator) -> dict[int, int]:
    """Spread ``m`` picks as evenly as possible over classes, capped by what each class has."""
    alloc = {c: 0 for c in counts}
    remaining = m
    while remaining > 0:
        active = [c for c in counts if alloc[c] < counts[c]]
        if not active:
            raise AssertionError("caller checked the total")  # pragma: no cover
        share = remaining // len(active)
        if share == 0:
            for i in rng.permutation(len(active))[:remaining]:
                alloc[active[i]] += 1
            break
        for c in active:
            give = min(share, counts[c] - alloc[c])
            alloc[c] += give
            remaining -= give
    return alloc


def _available(ds: ImageDataset, classes, exclude) -> dict[int, np.ndarray]:
    mask = np.ones(len(ds), dtype=bool)
    if exclude is not None:
        ex = np.asarray(exclude, dtype=np.int64).reshape(-1)
        if ex.size and (ex.min() < 0 or ex.max() >= len(ds)):
            raise ConfigError(f"exclude holds indices outside 0..{len(ds) - 1} of dataset {ds.name!r}")
        mask[ex] = False
    return {int(c): np.flatnonzero(mask & (ds.labels == c)) for c in classes}


def _pick(avail: dict[int, np.ndarray], m: int, rng, what: str, n_excluded: int) -> np.ndarray:
    counts = {c: len(v) for c, v in avail.items()}
    total = sum(counts.values())
    if total < m:
        per = ", ".join(f"class {c}: {k}" for c, k in counts.items())
        raise DataError(f"{what}: need {m} images of classes {sorted(counts)} but only {total} are "
                        f"available ({per}; {n_excluded} indices excluded)")
    alloc = _allocate(counts, m, rng)
    picks = [rng.choice(avail[c], size=k, replace=False) for c, k in alloc.items() if k > 0]
    return np.concatenate(picks).astype(np.int64) if picks else np.zeros(0, np.int64)


def _task_classes(ds: ImageDataset, kind: str, groups, task: str):
    present = set(int(c) for c in np.unique(ds.labels))
    if kind == "multiclass" and groups is None:
        return sorted(present)
    wanted = groups[0] if kind == "multiclass" else groups[0] + groups[1]
    missing = sorted(set(wanted) - present)
    if missing:
        raise ConfigError(f"task {task!r} uses class ids {missing} that dataset {ds.name!r} does not "
                          f"have (it has {sorted(present)})")
    return list(wanted)


def _build(ds: ImageDataset, idx: np.ndarray, kind: str, groups, spec: dict) -> TaskData:
    idx = np.sort(idx)
    classes = ds.labels[idx].astype(np.int64)
    x = torch.from_numpy(np.ascontiguousarray(ds.images[idx], dtype=np.float32))
    if kind == "binary":
        y = torch.from_numpy(np.where(np.isin(classes, groups[0]), 1.0, -1.0).astype(np.float32))
    elif groups is not None:  # multiclass:ids -> labels 0..k-1 in the order given
        label = {c: k for k, c in enumerate(groups[0])}
        y = torch.tensor([label[int(c)] for c in classes], dtype=torch.long)
    else:
        y = torch.from_numpy(classes.copy())
    mean = x.mean(0) if len(idx) else torch.zeros(ds.images.shape[1:])
    return TaskData(x, y, classes, idx, mean, kind, spec)


def _base_spec(ds: ImageDataset, task: str, n: int, seed: int, exclude, spec_extra) -> dict:
    spec = {"dataset": ds.name, "root": ds.root, "split": ds.split, "task": task, "n": int(n),
            "seed": int(seed)}
    if exclude is not None and len(exclude):
        spec["exclude"] = sorted(int(i) for i in np.asarray(exclude).reshape(-1))
    spec.update(spec_extra or {})
    return spec


def make_task(ds: ImageDataset, task: str, n: int, seed: int = 0, exclude: np.ndarray | None = None,
              spec_extra: dict | None = None) -> TaskData:
    """Pick ``n`` training images balanced over the labels (and over classes within each label)."""
    kind, groups = parse_task(task)
    if not isinstance(n, (int, np.integer)) or n <= 0:
        raise ConfigError(f"n must be a positive integer, got {n!r}")
    if kind == "binary" and n % 2:
        raise ConfigError(f"binary task {task!r} needs an even n (n/2 images per label), got n={n}")
    classes = _task_classes(ds, kind, groups, task)
    rng = np.random.default_rng(seed)
    avail = _available(ds, classes, exclude)
    n_ex = 0 if exclude is None else len(np.unique(np.asarray(exclude)))
    if kind == "binary":
        idx = np.concatenate([
            _pick({c: avail[c] for c in groups[0]}, n // 2, rng, f"task {task!r} label +1", n_ex),
            _pick({c: avail[c] for c in groups[1]}, n // 2, rng, f"task {task!r} label -1", n_ex)])
    else:
        idx = _pick(avail, n, rng, f"task {task!r}", n_ex)
    spec = _base_spec(ds, task, n, seed, exclude, spec_extra)
    return _build(ds, idx, kind, groups, spec)


def make_pool(ds: ImageDataset, task: str, size: int, exclude: np.ndarray | None, seed: int = 1,
              spec_extra: dict | None = None) -> TaskData:
    """Up to ``size`` unseen images of the task's classes, disjoint from ``exclude``, spread evenly
    over the classes. Takes everything available if fewer than ``size``; ``spec['n']`` is the
    actual size and ``spec['size']`` the requested one."""
    kind, groups = parse_task(task)
    if not isinstance(size, (int, np.integer)) or size <= 0:
        raise ConfigError(f"pool size must be a positive integer, got {size!r}")
    classes = _task_classes(ds, kind, groups, task)
    rng = np.random.default_rng(seed)
    avail = _available(ds, classes, exclude)
    total = sum(len(v) for v in avail.values())
    if total == 0:
        raise DataError(f"no images of classes {classes} in dataset {ds.name!r} are left for a pool "
                        f"after excluding {0 if exclude is None else len(exclude)} training indices")
    m = min(int(size), total)
    idx = _pick(avail, m, rng, f"pool for task {task!r}", 0)
    spec = _base_spec(ds, task, m, seed, exclude, spec_extra)
    spec.update({"kind": "pool", "size": int(size)})
    return _build(ds, idx, kind, groups, spec)


def regression_targets(classes: np.ndarray, num_classes: int) -> torch.Tensor:
    """Regression task on images: the class id mapped linearly onto [−1, 1]."""
    return torch.as_tensor(classes, dtype=torch.float32) / max(num_classes - 1, 1) * 2.0 - 1.0


def regression_tolerance(y: torch.Tensor) -> float:
    """Half the gap between neighbouring regression targets: a prediction this close rounds to the right class."""
    levels = torch.unique(y)
    return float((levels[1:] - levels[:-1]).min() / 2) if levels.numel() > 1 else 0.5


def as_regression(task_data: TaskData, num_classes: int) -> TaskData:
    """Turn a multiclass selection into the regression task (targets from the class ids)."""
    task_data.y = regression_targets(task_data.classes, num_classes)
    task_data.task = "regression"
    task_data.spec = {**task_data.spec, "target": "regression", "num_classes": num_classes}
    return task_data


def num_classes_of(ds: ImageDataset, task: str = "multiclass") -> int:
    """Number of outputs of a multiclass victim for ``task`` on ``ds`` (``multiclass:ids``: ``len(ids)``)."""
    kind, groups = parse_task(task)
    return len(groups[0]) if kind == "multiclass" and groups is not None else int(ds.labels.max()) + 1


def select_task(ds: ImageDataset, task: str, n: int, seed: int = 0) -> TaskData:
    """:func:`make_task` for every kind: a regression task is a multiclass selection with regression targets."""
    if task_kind(task) == "regression":
        return as_regression(make_task(ds, "multiclass", n, seed=seed), num_classes_of(ds))
    return make_task(ds, task, n, seed=seed)


def select_pool(ds: ImageDataset, task: str, size: int, exclude: np.ndarray | None, seed: int = 1) -> TaskData:
    """:func:`make_pool` for every kind (regression pools carry regression targets)."""
    if task_kind(task) == "regression":
        return as_regression(make_pool(ds, "multiclass", size, exclude=exclude, seed=seed), num_classes_of(ds))
    return make_pool(ds, task, size, exclude=exclude, seed=seed)


def dataset_of(spec: dict) -> ImageDataset:
    """The dataset a task ``spec`` was drawn from (load it once and pass it on to avoid re-reading)."""
    return load_dataset(spec["dataset"], spec.get("root"), spec.get("split", "train"))


def rebuild_task(spec: dict, ds: ImageDataset | None = None) -> TaskData:
    """Rebuild a :class:`TaskData` (training task or pool) from its ``spec`` dict; ``ds``: the
    already-loaded :func:`dataset_of` ``spec``."""
    missing = [k for k in ("dataset", "task", "n") if k not in spec]
    if missing:
        raise ConfigError(f"task spec lacks keys {missing}; expected dataset, root, split, task, n, seed")
    ds = dataset_of(spec) if ds is None else ds
    if spec.get("target") == "regression":  # a regression victim's training set: its multiclass selection, re-targeted
        base = {k: v for k, v in spec.items() if k not in ("target", "num_classes")}
        return as_regression(rebuild_task({**base, "task": "multiclass"}, ds), int(spec["num_classes"]))
    exclude = np.asarray(spec["exclude"], dtype=np.int64) if spec.get("exclude") else None
    known = {"dataset", "root", "split", "task", "n", "seed", "exclude", "kind", "size"}
    extra = {k: v for k, v in spec.items() if k not in known}
    if spec.get("kind") == "pool":
        return make_pool(ds, spec["task"], int(spec.get("size", spec["n"])), exclude,
                         int(spec.get("seed", 1)), spec_extra=extra)
    return make_task(ds, spec["task"], int(spec["n"]), int(spec.get("seed", 0)), exclude, spec_extra=extra)
