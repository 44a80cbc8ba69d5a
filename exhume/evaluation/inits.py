"""Initialisations for the attacks, built on the evaluator's side (Runkel et al., docs/METHODS.md §2).

An attack never reads the training set. These builders do, for the initialisation study: they
return display-space images that are passed to an attack as ``run(init=..., init_name=...)``.

- ``noise``: ``x_rnd ~ U(0, 1)`` (uses no data; not an oracle);
- ``ground-truth``: the victim's training images (oracle);
- ``partition``: images of the same classes from a disjoint part of the dataset, the same number
  per label as the training set (oracle: an evaluator tool);
- ``mix``: ``λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd`` (oracle).

Every set is ordered with the +1 images first, matching the attacks' fixed candidate labels
(:func:`exhume.equations.formulation.binary_labels`), so candidate ``j`` starts from an image of its label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from exhume.attacks.engine.record import ORACLE_INITS
from exhume.errors import ConfigError

INIT_KINDS = ("noise", *ORACLE_INITS)


@dataclass
class InitImages:
    """Starting images and the reference sets they were built from (all display space)."""

    images: torch.Tensor  # (m, C, H, W): pass as run(init=images)
    name: str  # pass as run(init_name=name); e.g. "mix(l1=0.25,l2=0.5)"
    oracle: bool  # built from real data (training set or partition): labelled oracle in outputs
    ground_truth: torch.Tensor  # the training images, ordered +1 first
    partition: torch.Tensor  # the partition images (disjoint from training), ordered +1 first
    noise: torch.Tensor  # the U(0,1) images
    partition_indices: np.ndarray  # dataset indices of the partition images
    description: str


def mix_images(gt: torch.Tensor, part: torch.Tensor, rnd: torch.Tensor, l1: float, l2: float) -> torch.Tensor:
    """``λ₂(λ₁·gt + (1 − λ₁)·part) + (1 − λ₂)·rnd``."""
    check_lambda("l1", l1)
    check_lambda("l2", l2)
    return l2 * (l1 * gt + (1.0 - l1) * part) + (1.0 - l2) * rnd


def check_lambda(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= float(value) <= 1.0):
        raise ConfigError(f"mix weight {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _label_order(y: torch.Tensor) -> torch.Tensor:
    """Indices that put the +1 images first (stable)."""
    return torch.argsort(-y.float(), stable=True)


def build_init(victim, kind: str, l1: float | None = None, l2: float | None = None, seed: int = 0,
               partition_seed: int = 7) -> InitImages:
    """Build the initialisation ``kind`` for ``victim`` (a :class:`~exhume.victim.Victim` with its data spec).

    ``l1``/``l2`` are the mix weights (only for ``kind="mix"``). ``seed`` draws the noise images,
    ``partition_seed`` the partition. The number of images is the training-set size ``n``.
    """
    if kind not in INIT_KINDS:
        raise ConfigError(f"unknown init {kind!r}; known: {', '.join(INIT_KINDS)}")
    if kind != "mix" and (l1 is not None or l2 is not None):
        raise ConfigError(f"mix weights l1/l2 only apply to init 'mix', not {kind!r}")
    if kind == "mix":
        if l1 is None or l2 is None:
            raise ConfigError("init 'mix' needs both weights l1 and l2 in [0, 1] (--mix-l1, --mix-l2)")
        l1, l2 = check_lambda("l1", l1), check_lambda("l2", l2)
    if getattr(victim, "task", None) != "binary":
        raise ConfigError(f"initialisations are built for binary victims here; this victim's task is {getattr(victim, 'task', None)!r}")
    from exhume.data import dataset_of, make_task

    ds = dataset_of(victim.data_spec) if victim.data_spec is not None else None
    train = victim.load_train_set(ds)
    spec = train.spec
    part = make_task(ds, spec["task"], len(train), seed=partition_seed, exclude=train.indices)
    gt = train.x[_label_order(train.y)]
    part_x = part.x[_label_order(part.y)]
    gen = torch.Generator().manual_seed(seed)
    rnd = torch.rand(gt.shape, generator=gen)
    if kind == "noise":
        images, name = rnd.clone(), "noise"
    elif kind == "ground-truth":
        images, name = gt.clone(), "ground-truth"
    elif kind == "partition":
        images, name = part_x.clone(), "partition"
    else:
        images, name = mix_images(gt, part_x, rnd, l1, l2), f"mix(l1={l1:g},l2={l2:g})"
    desc = (f"{name}: {len(images)} images; ground truth = the victim's {len(train)} training images; partition = "
            f"{len(part)} images of the same labels from {spec['dataset']}, disjoint from the training set (seed "
            f"{partition_seed}); noise = U(0,1) (seed {seed})")
    return InitImages(images=images, name=name, oracle=kind != "noise", ground_truth=gt, partition=part_x, noise=rnd,
                      partition_indices=np.asarray(part.indices), description=desc)
