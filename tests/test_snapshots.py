"""Which iterate kkt returns: the moving average of late iterates and the snapshot its own loss prefers."""

from __future__ import annotations

import torch
from torch import nn

from exhume.attacks import get_attack
from exhume.attacks.engine.snapshots import IterateTracker
from exhume.victim import AttackerView


def test_average_is_uniform_at_first_then_exponential():
    x = torch.zeros(3)
    tracker = IterateTracker({"x": x}, decay=0.5, every=1)
    for value in (1.0, 2.0, 3.0):
        tracker.update({"x": torch.full((3,), value)})
    # t=1: w=1 -> 1; t=2: β_t=min(0.5, 1/2) -> (1+2)/2 = 1.5; t=3: β=0.5 -> 0.5·1.5 + 0.5·3 = 2.25
    assert torch.allclose(tracker.avg["x"], torch.full((3,), 2.25))
    last = IterateTracker({"x": x}, decay=0.0, every=1)
    for value in (1.0, 7.0):
        last.update({"x": torch.full((3,), value)})
    assert torch.equal(last.avg["x"], torch.full((3,), 7.0))  # decay 0: the last iterate itself


def test_snapshot_keeps_the_lowest_criterion_and_its_iteration():
    tracker = IterateTracker({"x": torch.zeros(2)}, decay=0.0, every=1)
    for it, (value, score) in enumerate([(1.0, 3.0), (2.0, 1.0), (3.0, 2.0), (4.0, float("nan"))], start=1):
        tracker.update({"x": torch.full((2,), value)})
        tracker.consider(it, lambda t, s=score: s)
    assert tracker.best_iteration == 2 and tracker.best_score == 1.0
    assert torch.equal(tracker.best["x"], torch.full((2,), 2.0))


def tiny_view():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16, bias=False), nn.ReLU(), nn.Linear(16, 1, bias=False), nn.Flatten(0))
    return AttackerView(model=model, task="binary", input_shape=(10,), mean=torch.zeros(10), n_train_hint=6)


def test_kept_snapshot_is_never_worse_than_the_last_iterate_by_the_attacks_own_loss(monkeypatch):
    from exhume.attacks.kkt import settings

    view = tiny_view()
    kw = dict(iterations=300, lr=0.05, average_decay=0.9)
    monkeypatch.setattr(settings, "SNAPSHOT_EVERY", 10**9)  # no snapshot inside the run: the last averaged iterate is kept
    last = get_attack("kkt", **kw).run(view, progress=False, seed=1)
    monkeypatch.setattr(settings, "SNAPSHOT_EVERY", 50)  # the same descent, a snapshot every 50 iterations
    best = get_attack("kkt", **kw).run(view, progress=False, seed=1)
    assert last.summary["kept_iteration"] == 300
    assert 50 <= best.summary["kept_iteration"] <= 300 and best.summary["kept_iteration"] % 50 == 0
    assert best.summary["kept_criterion"] <= last.summary["kept_criterion"]
    assert "moving average" in best.summary["kept_iterate"]


def test_averaged_iterate_is_not_worse_than_the_last_iterate(monkeypatch):
    from exhume.attacks.kkt import settings

    monkeypatch.setattr(settings, "SNAPSHOT_EVERY", 10**9)  # the final iterates compared, averaged or not
    view = tiny_view()
    kw = dict(iterations=400, lr=0.05)
    avg = get_attack("kkt", average_decay=0.95, **kw).run(view, progress=False, seed=2)
    plain = get_attack("kkt", average_decay=0.0, **kw).run(view, progress=False, seed=2)
    assert avg.summary["kept_criterion"] <= plain.summary["kept_criterion"] * 1.05
