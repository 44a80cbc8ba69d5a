"""Evaluator-side initialisations (noise, ground truth, partition, mix) and the membership AUC."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exhume.errors import ConfigError
from exhume.evaluation.inits import build_init
from exhume.evaluation.membership import auc_mann_whitney, membership_uncertainty
from exhume.victim import load_victim


@pytest.fixture(scope="module")
def victim(make_tiny_victim):
    return load_victim(make_tiny_victim(arch="affine", epochs=50, lr=0.5, test_size=0))


def test_init_builders_shapes_order_oracle_and_disjoint_partition(victim):
    train = victim.train_set
    gt = build_init(victim, "ground-truth")
    assert gt.images.shape == (10, 1, 28, 28) and gt.oracle and gt.name == "ground-truth"
    # ordered +1 first, as the attacks' labels are: the first five are the training set's odd digits
    pos = train.x[train.y > 0]
    assert torch.equal(gt.images[:5], pos)
    part = build_init(victim, "partition")
    assert part.oracle and not set(part.partition_indices.tolist()) & set(train.indices.tolist())
    from exhume.data import load_dataset

    classes = load_dataset("mnist").labels[np.sort(part.partition_indices)]
    assert (classes % 2 == 1).sum() == 5  # same labels, same balance
    noise = build_init(victim, "noise", seed=3)
    assert not noise.oracle and noise.images.min() >= 0 and noise.images.max() <= 1
    mix = build_init(victim, "mix", 0.25, 0.5, seed=3)
    expected = 0.5 * (0.25 * gt.images + 0.75 * part.images) + 0.5 * noise.images
    assert torch.equal(mix.images, expected)  # the formula, exactly
    assert mix.oracle and mix.name == "mix(l1=0.25,l2=0.5)"


def test_init_builder_refuses_bad_arguments(victim):
    with pytest.raises(ConfigError, match="unknown init"):
        build_init(victim, "zeros")
    with pytest.raises(ConfigError, match="needs both"):
        build_init(victim, "mix", 0.5, None)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        build_init(victim, "mix", 1.5, 0.5)
    with pytest.raises(ConfigError, match="only apply"):
        build_init(victim, "partition", 0.5, 0.5)


def test_membership_auc_on_hand_made_cases():
    gen = torch.Generator().manual_seed(0)
    train, held = torch.rand(20, 1, 8, 8, generator=gen), torch.rand(30, 1, 8, 8, generator=gen)
    copies = membership_uncertainty(train.clone(), train, held)
    assert copies["auc"] == 1.0 and copies["candidate_closer_to_train"] == 1.0 and copies["mean_d_train"] == 0.0
    others = membership_uncertainty(held.clone(), train, held)
    assert others["auc"] == 0.0 and others["candidate_closer_to_train"] == 0.0
    fresh = torch.rand(200, 1, 8, 8, generator=gen)  # unrelated images: no membership information
    assert 0.3 < membership_uncertainty(fresh, train, held)["auc"] < 0.7
    assert auc_mann_whitney(np.array([1.0, 1.0]), np.array([1.0])) == 0.5  # ties count half
    with pytest.raises(ConfigError, match="same image size"):
        membership_uncertainty(torch.rand(3, 5), train, held)
    with pytest.raises(ConfigError, match="NaN"):
        membership_uncertainty(torch.full((3, 1, 8, 8), float("nan")), train, held)
