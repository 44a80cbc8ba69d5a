"""The informed adversary's choices, measured through the package: the game's score and multipliers, kkt's ranking.

    python research/informed_choices.py game VICTIM --targets 30 --multipliers auto     # and free
    python research/informed_choices.py game VICTIM --targets 30 --score auto           # the alignment where the read applies
    python research/informed_choices.py rank VICTIM --targets 30 --multipliers free     # and auto
    python research/informed_choices.py layer VICTIM --targets 30                       # the first layer's scores, ungated

VICTIM: a victim folder of ``exhume experiment dp`` (``runs/dp-informed/cells/paper_<level>_s0/victim``); with
``--setting minibatch`` the attacker knows its start and training, as in the experiment.

- ``game``: for each of the first ``--targets`` training records, every other one known, the record
  among 99 unseen images (a seeded draw), one ``exhume.attack(..., "game")`` run; the wins at k = 2, 8
  and 100 on the first k − 1 of them. ``--multipliers auto``: 1/(n·w) for h = −ℓ; ``free``: fitted. ``--score``: the
  game's (``explained``, the default here: the explained share everywhere, what kkt's ranking asks the game for;
  ``auto``: the game's own, the alignment off the known records' span where the first layer there is rank one).
- ``layer``: the same games scored from the first layer alone whether or not it is rank one off the known records'
  span: each candidate's part off that span by its ``|cos|`` to the remainder's top direction (``align``) and by the
  norm of the remainder along it (``energy``); what the game would name if the read's gate were dropped.
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
from exhume.attacks.kkt.game import CandidateGame
from exhume.data import load_dataset
from exhume.data.tasks import select_pool
from exhume.evaluation.informed import game_wins, reconstructed
from exhume.experiments.dp.cells import threat_of
from exhume.request import ThreatModel, view_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("game", "rank", "layer"))
    ap.add_argument("victim")
    ap.add_argument("--targets", type=int, default=30)
    ap.add_argument("--multipliers", choices=("auto", "free"), default="free")
    ap.add_argument("--score", choices=("auto", "explained"), default="explained")
    ap.add_argument("--setting", choices=("paper", "minibatch"), default="paper",
                    help="the victim's setting in exhume experiment dp: 'minibatch' gives the attacker its start")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    victim = exhume.load_victim(args.victim)
    threat = threat_of(victim, args.setting)
    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    pool = select_pool(ds, train.spec["task"], 1000, exclude=np.asarray(train.indices), seed=5)
    rng, found, shares = np.random.default_rng(0), {}, []
    base = exhume.attack(victim, "kkt", restarts=1, progress=False, iterations=3000, seed=0) if args.mode == "rank" else None
    for t in range(args.targets):
        rest = [i for i in range(len(train)) if i != t]
        known = (train.x[rest], train.y[rest])
        if args.mode in ("game", "layer"):
            others = rng.choice(len(pool), 99, replace=False)
            cand = (torch.cat([train.x[t:t + 1], pool.x[others]]), torch.cat([train.y[t:t + 1], pool.y[others]]))
            if args.mode == "layer":
                for name, s in _layer_scores(victim, known, cand[0], len(train), threat).items():
                    for k, won in game_wins(s[0], s[1:], (2, 8, 100)).items():
                        found[name, k] = found.get((name, k), 0) + int(won)
                continue
            view = view_of(victim, ThreatModel(known_records=known, **threat))
            s = CandidateGame(multipliers=args.multipliers).scores(view, *cand, alignment=args.score == "auto")[0].numpy()
            shares.append(s[0])
            for k, won in game_wins(s[0], s[1:], (2, 8, 100)).items():
                found[k] = found.get(k, 0) + int(won)
        else:
            r = exhume.attack(victim, "game", restarts=1, progress=False, multipliers=args.multipliers, known_records=known,
                              candidates=(base.candidates.clamp(0, 1), base.labels))
            for top in (1, 2, 4):
                found[top] = found.get(top, 0) + int(reconstructed(train.x[t:t + 1], r.candidates[:top], pool.x)[0])
    print(args.mode, args.multipliers, args.score, found, "of", args.targets,
          f"(the target's median share of the remainder {np.median(shares):.3f})" if shares else "", flush=True)
    return 0


def _layer_scores(victim, known, cand: torch.Tensor, n: int, threat: dict) -> dict[str, np.ndarray]:
    """The first layer off the known records' span, ungated: each candidate's ``align`` and ``energy`` (module docstring)."""
    from exhume.attacks.kkt.read import _added
    from exhume.attacks.kkt.subspace import input_layer
    from exhume.equations.remainder import orthonormal
    view = view_of(victim, ThreatModel(known_records=known, **threat))
    params = {k: v.detach() for k, v in view.model.named_parameters()}
    name = input_layer(view.model, params, tuple(view.input_shape))
    mean = view.mean.double()
    q = orthonormal((known[0].double() - mean).reshape(len(known[0]), -1))
    w = _added(view, name, params[name].double(), n)
    rest = w - (w @ q) @ q.T
    top = torch.linalg.svd(rest, full_matrices=False)[2][0]
    c = (cand.double() - mean).reshape(len(cand), -1)
    c = c - (c @ q) @ q.T
    c = c / c.norm(dim=1, keepdim=True)
    return {"align": (c @ top).abs().numpy(), "energy": (rest @ c.T).norm(dim=0).numpy()}


if __name__ == "__main__":
    raise SystemExit(main())
