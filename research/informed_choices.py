"""The informed adversary's two choices, measured through the package: the game's multipliers and kkt's ranking.

    python research/informed_choices.py game VICTIM --targets 30 --multipliers auto     # and free
    python research/informed_choices.py rank VICTIM --targets 30 --multipliers free     # and auto

VICTIM: a victim folder of ``exhume experiment dp`` (``runs/dp-informed/cells/paper_<level>_s0/victim``).

- ``game``: for each of the first ``--targets`` training records, every other one known, the record
  among 99 unseen images (a seeded draw), one ``exhume.attack(..., "game")`` run; the wins at k = 2, 8
  and 100 on the first k − 1 of them. ``--multipliers auto``: 1/(n·w) for h = −ℓ; ``free``: fitted.
- ``rank``: one kkt run (3,000 iterations, seed 0) on the weights; for each target its candidates
  ranked by ``game`` with the other records known, and whether the first 1, 2 or 4 reconstruct it (the
  memorisation criterion against 1,000 unseen images).

Evaluator-side: reads the training set to play the known records and to judge.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import exhume
from exhume.data import load_dataset
from exhume.data.tasks import select_pool
from exhume.evaluation.informed import game_wins, reconstructed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("game", "rank"))
    ap.add_argument("victim")
    ap.add_argument("--targets", type=int, default=30)
    ap.add_argument("--multipliers", choices=("auto", "free"), default="free")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    victim = exhume.load_victim(args.victim)
    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    pool = select_pool(ds, train.spec["task"], 1000, exclude=np.asarray(train.indices), seed=5)
    rng, found, shares = np.random.default_rng(0), {}, []
    base = exhume.attack(victim, "kkt", restarts=1, progress=False, iterations=3000, seed=0) if args.mode == "rank" else None
    for t in range(args.targets):
        rest = [i for i in range(len(train)) if i != t]
        known = (train.x[rest], train.y[rest])
        if args.mode == "game":
            others = rng.choice(len(pool), 99, replace=False)
            cand = (torch.cat([train.x[t:t + 1], pool.x[others]]), torch.cat([train.y[t:t + 1], pool.y[others]]))
            r = exhume.attack(victim, "game", restarts=1, progress=False, multipliers=args.multipliers, known_records=known, candidates=cand)
            s = np.asarray(r.record.extras["scores"])
            shares.append(s[0])
            for k, won in game_wins(s[0], s[1:], (2, 8, 100)).items():
                found[k] = found.get(k, 0) + int(won)
        else:
            r = exhume.attack(victim, "game", restarts=1, progress=False, multipliers=args.multipliers, known_records=known,
                              candidates=(base.candidates.clamp(0, 1), base.labels))
            for top in (1, 2, 4):
                found[top] = found.get(top, 0) + int(reconstructed(train.x[t:t + 1], r.candidates[:top], pool.x)[0])
    print(args.mode, args.multipliers, found, "of", args.targets,
          f"(the target's median share of the remainder {np.median(shares):.3f})" if shares else "", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
