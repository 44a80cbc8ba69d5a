"""The first layer's read (exhume/attacks/kkt/read.py): its margin swept on victims of ``exhume experiment dp``'s two
settings at ε = ∞, trained here at a seed the experiment does not use (its default is seed 0).

    python research/informed_read.py --seed 1 --targets 40 --margins 0.03,0.06,0.1,0.15,0.2,0.3,0.5

Each victim is trained once into ``runs/informed-read/<setting>_none_s<seed>/victim`` (the experiment's recipe,
public-mean centring); per margin, the targets (the first ``--targets`` training records, each with the other 99
known) read and judged by the memorisation criterion (pool of 1,000 unseen, seed 5) and against one control each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import exhume.attacks.kkt.read as read
from exhume.evaluation.informed import reconstructed
from exhume.experiments.dp.cells import threat_of, victim_of
from exhume.experiments.dp.cli import NON_PRIVATE
from exhume.experiments.dp.informed import samples
from exhume.request import ThreatModel, view_of


def sweep(setting: str, seed: int, targets: int, margins: list[float]) -> None:
    folder = Path(f"runs/informed-read/{setting}_none_s{seed}/victim")
    victim = victim_of(setting, NON_PRIVATE, seed, {"n": 100, "epochs": None}, folder, True, False)
    train, pool, _, controls = samples(victim, {"targets": targets}, 0)
    hits, matched = dict.fromkeys(margins, 0), dict.fromkeys(margins, 0)
    for t in range(targets):
        rest = [i for i in range(len(train)) if i != t]
        view = view_of(victim, ThreatModel(known_records=(train.x[rest], train.y[rest]), **threat_of(victim, setting)))
        for m in margins:
            read.MARGIN = m
            got = read.read_target(view, len(train))
            if got.candidates is not None:
                hits[m] += int(reconstructed(train.x[t:t + 1], got.candidates, pool.x)[0])
                matched[m] += int(reconstructed(controls.x[t:t + 1], got.candidates, pool.x)[0])
    for m in margins:
        print(f"{setting} seed {seed} margin {m}: reconstructed {hits[m]} of {targets}, controls matched {matched[m]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--targets", type=int, default=40)
    ap.add_argument("--settings", default="paper,minibatch")
    ap.add_argument("--margins", default="0.03,0.06,0.1,0.15,0.2,0.3,0.5")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for setting in args.settings.split(","):
        sweep(setting, args.seed, args.targets, [float(m) for m in args.margins.split(",")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
