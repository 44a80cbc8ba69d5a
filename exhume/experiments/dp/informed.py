"""The informed adversary on one victim of ``exhume experiment dp`` (docs/METHODS.md §7): for each target, every other
training record known, the cell's kkt solve ranked by what they leave (it does not depend on the target, so it runs
once per victim) and judged on its named candidates and on a control; and the game among 99 unseen images, whose
one run decides every smaller k on its first candidates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exhume.experiments.dp.cells import METHOD, threat_of
from exhume.experiments.dp.cli import NON_PRIVATE

#: the candidates of the largest game: the target and the images never trained on beside it
LARGEST = 100


def samples(victim, s: dict[str, Any], seed: int):
    """``(training set, evaluator's pool, public images, controls)``: the pool of the memorisation criterion (1,000), the
    game's other candidates and the control records (never trained on, disjoint from each other and from the pool)."""
    from exhume.data import load_dataset
    from exhume.data.tasks import select_pool

    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    task = train.spec["task"]
    pool = select_pool(ds, task, 1000, exclude=np.asarray(train.indices), seed=seed + 5)
    taken = np.concatenate([np.asarray(train.indices), np.asarray(pool.indices)])
    public = select_pool(ds, task, 4 * LARGEST, exclude=taken, seed=seed + 7)
    controls = select_pool(ds, task, s["targets"], exclude=np.concatenate([taken, np.asarray(public.indices)]), seed=seed + 9)
    return train, pool, public, controls


def informed_cell(victim, recon, setting: str, level: str, seed: int, s: dict[str, Any]) -> dict[str, Any]:
    """The informed columns of one victim: targets reconstructed and controls matched (free reconstruction), and the
    game's wins at each k of ``s["games"]``, over ``s["targets"]`` targets."""
    import exhume
    from exhume.attacks import get_attack
    from exhume.evaluation.informed import game_wins, reconstructed
    from exhume.request import ThreatModel, view_of

    train, pool, public, controls = samples(victim, s, seed)
    rng = np.random.default_rng(seed)
    threat, kkt = threat_of(victim, setting), get_attack(METHOD)
    hits, matched, wins = 0, 0, dict.fromkeys(s["games"], 0)
    for t in range(s["targets"]):
        rest = [i for i in range(len(train)) if i != t]
        known = (train.x[rest], train.y[rest])
        ranked = kkt.informed(view_of(victim, ThreatModel(known_records=known, **threat)), recon)
        named = ranked.candidates[:ranked.record.settings["informed_named"]]
        hits += int(reconstructed(train.x[t:t + 1], named, pool.x)[0])
        matched += int(reconstructed(controls.x[t:t + 1], named, pool.x)[0])
        others = rng.choice(len(public), LARGEST - 1, replace=False)
        cand = (torch.cat([train.x[t:t + 1], public.x[others]]), torch.cat([train.y[t:t + 1], public.y[others]]))
        game = exhume.attack(victim, "game", restarts=1, progress=False, known_records=known, candidates=cand,
                             multipliers="auto" if level == NON_PRIVATE else "free", **threat)
        shares = np.asarray(game.record.extras["scores"])
        for k, won in game_wins(shares[0], shares[1:], tuple(s["games"])).items():
            wins[k] += int(won)
    return {"targets": s["targets"], "reconstructed": hits, "controls_matched": matched,
            **{f"game_{k}": w for k, w in wins.items()}}
