"""The informed adversary: known records and candidates in the threat model, what known records leave of an equation,
the candidate game, kkt's ranking with known records, and the evaluator's informed measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import exhume
from exhume.equations.remainder import Remainder, explained, orthonormal
from exhume.errors import ConfigError
from exhume.evaluation.informed import game_wins, reconstructed
from exhume.request import ThreatModel, view_of
from exhume.victim import TrainConfig, make_victim


@pytest.fixture(scope="module")
def victim():
    """A tiny victim near a stationary point of mean loss + (w/2)‖θ‖² (full batch, weight decay)."""
    return make_victim("mnist", "odd-even", 12, "mlp:32;bias=none", TrainConfig(loss="logistic", lr=0.5, weight_decay=5e-3,
                       max_epochs=3000), test_size=0, progress=False)


def test_the_remainder_leaves_exactly_what_the_known_columns_cannot_explain():
    """target = known columns' combination + 0.3·member: the member explains all the remainder, a column inside the known
    span none of it, and a column with a part outside exactly that part's share."""
    gen = torch.Generator().manual_seed(0)
    known, member = torch.randn(5, 40, generator=gen, dtype=torch.float64), torch.randn(40, generator=gen, dtype=torch.float64)
    target = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0], dtype=torch.float64) @ known + 0.3 * member
    rem = Remainder(("w",), orthonormal(known), 5)
    inside = (torch.tensor([0.2, 0.1, -1.0, 0.0, 2.0], dtype=torch.float64) @ known)
    shares = explained(rem, target, torch.stack([member, inside, inside + member])[:, None], signed=True)
    assert shares[0] == pytest.approx(1.0, abs=1e-9) and shares[1] == pytest.approx(0.0, abs=1e-9)
    assert shares[2] == pytest.approx(1.0, abs=1e-9)  # its part off the span is the member's
    given = explained(rem, target, member[None, None], signed=True, given=torch.tensor([0.3], dtype=torch.float64))
    assert given[0] == pytest.approx(1.0, abs=1e-9)  # the true multiplier leaves nothing


def test_known_records_and_candidates_enter_through_the_threat_model(victim, tmp_path):
    ts = victim.train_set
    np.savez(tmp_path / "known.npz", x=ts.x[1:].numpy(), y=(ts.y[1:] > 0).long().numpy())  # 0/1 labels read as ±1
    view = view_of(victim, ThreatModel(known_records=tmp_path / "known.npz", candidates=(ts.x[:3], ts.y[:3])))
    assert len(view.known) == 11 and torch.equal(view.known.y, ts.y[1:]) and len(view.candidates) == 3
    assert "11 training records known" in view.threat_model and "3 candidates" in view.threat_model
    with pytest.raises(ConfigError, match=r"known_records: images of shape \(11, 1, 14, 14\); expected"):
        view_of(victim, ThreatModel(known_records=(ts.x[1:, :, :14, :14], ts.y[1:])))
    with pytest.raises(ConfigError, match="'bilevel' attack does not use known training records"):
        exhume.attack(victim, "bilevel", restarts=1, progress=False, known_records=(ts.x[1:], ts.y[1:]))


def test_the_game_names_the_trained_on_record_among_unseen_ones(victim):
    """Every other training record known, the target among 7 images never trained on: named far above chance (1/8)."""
    from exhume.data import load_dataset
    from exhume.data.tasks import select_pool

    ts = victim.train_set
    unseen = select_pool(load_dataset("mnist"), ts.spec["task"], 7, exclude=np.asarray(ts.indices), seed=3)
    named = 0
    for t in range(len(ts)):
        rest = [i for i in range(len(ts)) if i != t]
        cand = (torch.cat([unseen.x[:3], ts.x[t:t + 1], unseen.x[3:]]), torch.cat([unseen.y[:3], ts.y[t:t + 1], unseen.y[3:]]))
        r = exhume.attack(victim, "game", restarts=1, progress=False, known_records=(ts.x[rest], ts.y[rest]), candidates=cand)
        named += r.record.settings["named"] == 3
        assert sorted(r.record.settings["order"]) == list(range(8)) and "1/(n·w)" in r.record.settings["multipliers_used"]
    assert named >= 10, named


def test_kkt_with_known_records_ranks_its_own_candidates_by_the_game(victim):
    ts = victim.train_set
    plain = exhume.attack(victim, "kkt", restarts=1, iterations=30, progress=False)
    ranked = exhume.attack(victim, "kkt", restarts=1, iterations=30, progress=False, known_records=(ts.x[1:], ts.y[1:]))
    assert torch.equal(torch.sort(ranked.candidates.flatten(1), 0).values, torch.sort(plain.candidates.flatten(1), 0).values)
    game = exhume.attack(victim, "game", restarts=1, progress=False, known_records=(ts.x[1:], ts.y[1:]), multipliers="free",
                         candidates=(plain.candidates.clamp(0, 1), plain.labels))
    assert torch.allclose(ranked.scores, game.scores, atol=1e-6) and ranked.record.settings["informed_named"] == 2


def test_the_game_is_won_only_strictly_and_a_target_reconstructed_only_above_the_pool():
    assert game_wins(0.5, np.array([0.1, 0.5, 0.9]), (2, 3, 4)) == {2: True, 3: False, 4: False}
    with pytest.raises(ValueError, match="2 ≤ k ≤ 4"):
        game_wins(0.5, np.array([0.1, 0.2, 0.3]), (5,))
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    pool = torch.rand(20, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    assert reconstructed(x, x[[0]], pool).tolist() == [True, False, False]


def test_exhume_attack_takes_the_game_from_files_and_the_record_names_the_threat_model(victim, tmp_path, capsys):
    from exhume.attacks import load_reconstruction
    from exhume.cli import main

    ts = victim.train_set
    victim.save(tmp_path / "v")
    np.savez(tmp_path / "known.npz", x=ts.x[1:].numpy(), y=ts.y[1:].numpy())
    np.savez(tmp_path / "cands.npz", x=torch.cat([ts.x[:1], 1 - ts.x[1:4]]).numpy(), y=ts.y[:4].numpy())
    assert main(["attack", str(tmp_path / "v"), "--method", "game", "--known-records", str(tmp_path / "known.npz"),
                 "--candidates", str(tmp_path / "cands.npz"), "--restarts", "1", "--no-progress", "-o", str(tmp_path / "g")]) == 0
    got = load_reconstruction(tmp_path / "g")
    assert "11 training records known" in got.record.threat_model and "4 candidates" in got.record.threat_model
    assert got.record.settings["named"] == 0


def test_a_training_set_mean_gives_the_informed_adversary_the_target_without_the_weights():
    """x_t = n·μ − Σ_{k≠t} x_k where μ is the training set's mean (the view holds it); centred by a public mean instead
    (every private victim's, or public_centring=True), the same arithmetic misses the target."""
    kw = dict(data="mnist", task="odd-even", n=12, arch="mlp:8;bias=all", train=TrainConfig(loss="logistic", max_epochs=2),
              test_size=0, progress=False)
    for public, close in ((False, True), (True, False)):
        v = make_victim(**kw, public_centring=public)
        x = v.train_set.x
        guess = len(x) * v.attacker_view().mean - x[1:].sum(0)
        assert torch.allclose(guess, x[0], atol=1e-4) == close
    assert "public" in v.train_config["centring"]
