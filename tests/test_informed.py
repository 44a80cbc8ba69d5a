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


@pytest.fixture(scope="module")
def public_victim():
    """The fixture's recipe, wider, centred by a public mean: its first layer is ``Σ G_i x̃_iᵀ`` of inputs no mean ties."""
    return make_victim("mnist", "odd-even", 12, "mlp:64;bias=none", TrainConfig(loss="logistic", lr=0.5, weight_decay=5e-3,
                       max_epochs=3000), test_size=0, progress=False, public_centring=True)


def _cosines(victim, known_start: dict | None = None) -> list[float | None]:
    from exhume.attacks.kkt.read import read_target

    ts, out = victim.train_set, []
    mean = victim.attacker_view().mean
    for t in range(len(ts)):
        rest = [i for i in range(len(ts)) if i != t]
        read = read_target(view_of(victim, ThreatModel(known_records=(ts.x[rest], ts.y[rest]), **(known_start or {}))), len(ts))
        if read.candidates is None:
            out.append(None)
            continue
        a, b = (read.candidates[0] - mean).flatten().double(), (ts.x[t] - mean).flatten().double()
        out.append(float(a @ b / (a.norm() * b.norm())))
    return out


def test_the_first_layer_reads_the_one_unknown_record(public_victim):
    """Every record but one known: the read gives the target itself (clipped to [0, 1]), most to |cos| ≥ 0.99, where its part
    off the known records' span alone (what a read of that rank-one remainder gives) lies at |cos| 0.2–0.6 of it."""
    cos = _cosines(public_victim)
    assert all(c is not None for c in cos), cos
    assert np.median(cos) >= 0.96 and sum(c >= 0.99 for c in cos) >= 4 and min(cos) >= 0.6, cos


def test_the_read_needs_every_record_but_one_and_a_mean_that_ties_no_records(victim, public_victim):
    from exhume.attacks.kkt.read import read_target

    ts = public_victim.train_set
    two_unknown = read_target(view_of(public_victim, ThreatModel(known_records=(ts.x[2:], ts.y[2:]))), len(ts))
    assert two_unknown.candidates is None and "every record but one known: 10 of n = 12" in two_unknown.why
    ts = victim.train_set  # centred by its own training mean: the target lies in the known records' span, nothing is off it
    tied = read_target(view_of(victim, ThreatModel(known_records=(ts.x[1:], ts.y[1:]))), len(ts))
    assert tied.candidates is None and "not rank one" in tied.why


def test_kkt_with_every_record_but_one_known_names_the_read(public_victim):
    from exhume.attacks.kkt.read import read_target

    ts = public_victim.train_set
    known = (ts.x[1:], ts.y[1:])
    got = exhume.attack(public_victim, "kkt", restarts=1, iterations=20, progress=False, known_records=known)
    read = read_target(view_of(public_victim, ThreatModel(known_records=known)), len(ts))
    s = got.record.settings
    assert s["informed_read"] == "read" and s["informed_named"] == 2 and s["read_layer"] == "net.0.weight"
    assert torch.allclose(got.candidates[:2], read.candidates, atol=1e-6) and got.candidates.shape[0] == 2 + 24


def test_with_the_start_known_the_read_takes_what_training_added():
    """Mini-batch SGD from PyTorch's initialisation: weights only, the initialisation buries the target (the read refuses,
    saying so); with the start and settings known, what training added reads the targets, most to |cos| ≥ 0.99 (64 units:
    a unit the reweighting lets go of is a larger share of them than on the measured victims' 256)."""
    from exhume.victim import MiniBatchConfig

    cfg = MiniBatchConfig(loss="logistic", optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=4, epochs=30)
    v = make_victim("mnist", "odd-even", 12, "mlp:64;bias=all", cfg, test_size=0, progress=False, public_centring=True,
                    keep_start=True)
    weights_only = _cosines(v)
    assert weights_only == [None] * 12
    known = {"start": v.start, "training": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "steps": 90}}
    cos = _cosines(v, known)
    assert min(cos) >= 0.8 and np.median(cos) >= 0.99 and sum(c >= 0.95 for c in cos) >= 10, cos


def test_the_reweighting_lets_go_of_units_whose_open_records_were_miscounted():
    """``(WQ)_j = Σ_{k open at j} G_kj·c_k + u_j·d`` on 200 units, 30 of them also holding a record counted shut there: plain
    least squares takes that record into ``d``, the reweighted one gives ``d`` back; on clean units both are exact."""
    from exhume.attacks.kkt import read

    gen = torch.Generator().manual_seed(0)
    h, k, r = 200, 40, 40
    c = torch.randn(k, r, generator=gen, dtype=torch.float64)
    d = torch.randn(r, generator=gen, dtype=torch.float64)
    u = torch.randn(h, generator=gen, dtype=torch.float64)
    opened = torch.rand(k, h, generator=gen) < 0.3
    wq = (torch.randn(k, h, generator=gen, dtype=torch.float64) * opened).T @ c + u[:, None] * d[None]
    assert torch.allclose(read._in_span(wq, c, u, opened), d, atol=1e-8)
    bad = wq.clone()
    bad[:30] += 3.0 * c[(~opened[:, :30]).double().argmax(0)]  # a record each unit counts shut, open in training
    cos = {}
    for times in (0, read.REWEIGHTS):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(read, "REWEIGHTS", times)
            got = read._in_span(bad, c, u, opened)
        cos[times] = float(got @ d / (got.norm() * d.norm()))
    assert cos[0] < 0.99 and cos[read.REWEIGHTS] > 0.9999, cos


def test_where_the_read_applies_the_game_scores_by_the_alignment_off_the_known_span(public_victim, victim):
    """Every other record known and the first layer off their span rank one: the trained-on candidate lines up with it
    (|cos| ≈ 1) and is named among 7 unseen images for every target; where the known records' span holds the target
    (a training-set mean) there is no alignment and the game keeps the explained share."""
    from exhume.attacks.kkt.read import aligned
    from exhume.data import load_dataset
    from exhume.data.tasks import select_pool

    ts = public_victim.train_set
    unseen = select_pool(load_dataset("mnist"), ts.spec["task"], 7, exclude=np.asarray(ts.indices), seed=3)
    for t in range(len(ts)):
        rest = [i for i in range(len(ts)) if i != t]
        cand = (torch.cat([unseen.x[:3], ts.x[t:t + 1], unseen.x[3:]]), torch.cat([unseen.y[:3], ts.y[t:t + 1], unseen.y[3:]]))
        r = exhume.attack(public_victim, "game", restarts=1, progress=False, known_records=(ts.x[rest], ts.y[rest]),
                          candidates=cand)
        assert r.record.settings["named"] == 3 and "alignment" in r.record.settings["scored_by"]
        assert r.scores[0] > 0.99 and r.scores[1] < 0.9, r.scores
    from exhume.attacks.kkt.game import CandidateGame

    view = view_of(public_victim, ThreatModel(known_records=(ts.x[1:], ts.y[1:])))
    _, info = CandidateGame().scores(view, cand[0], cand[1], alignment=False)  # what kkt's ranking asks for
    assert "explained share" in info["scored_by"]
    own = victim.train_set
    assert aligned(view_of(victim, ThreatModel(known_records=(own.x[1:], own.y[1:]))), len(own), own.x[:3]) is None
