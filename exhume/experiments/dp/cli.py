"""``exhume experiment dp``'s settings: the victims, the privacy levels, the CPU default and ``--full``, the flags."""

from __future__ import annotations

import argparse
from typing import Any

from exhume.errors import ConfigError
from exhume.experiments.registry import positive_numbers, seed_list
from exhume.victim.recipe import PAPER_ARCH, PAPER_TRAIN

#: the victims: the architecture, its training, whether its start is known to the attacker
SETTINGS: dict[str, dict[str, Any]] = {
    "paper": {"arch": PAPER_ARCH, "trainer": "full-batch", "train": {"loss": "logistic", **PAPER_TRAIN, "max_epochs": 6000},
              "start_known": False, "what": "the demo's victim, full-batch GD, weights only"},
    "minibatch": {"arch": "mlp:256,128;bias=all", "trainer": "mini-batch",
                  "train": {"loss": "logistic", "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
                            "batch_size": 25, "epochs": 100},
                  "start_known": True, "what": "mini-batch SGD MLP, start known"},
    "cnn": {"arch": "cnn:16;fc=256;pool=avg", "trainer": "full-batch",
            "train": {"loss": "logistic", **PAPER_TRAIN, "max_epochs": 3000},
            "start_known": False, "what": "the recipe CNN (full-batch GD, wd 5e-3), weights only"},
    "cnn-start": {"arch": "cnn:16,32;fc=64;pool=max;bias=all", "trainer": "mini-batch",
                  "train": {"loss": "logistic", "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
                            "batch_size": 25, "epochs": 100},
                  "start_known": True, "what": "an ordinary CNN (mini-batch SGD), start known"},
}
DEFAULTS = {"settings": ["paper", "minibatch"], "epsilons": [10000.0, 1000.0, 100.0, 10.0, 1.0], "noise_multipliers": [],
            "clip_only": True, "seeds": [0], "iterations": 3000, "max_grad_norm": 0.1, "delta": 1e-5, "n": 100, "restarts": 1,
            "targets": 10, "games": [2, 8, 100]}
FULL = {**DEFAULTS, "settings": ["paper", "minibatch", "cnn", "cnn-start"],
        "epsilons": [10000.0, 1000.0, 300.0, 100.0, 30.0, 10.0, 3.0, 1.0], "noise_multipliers": [0.003, 0.01, 0.03, 0.1],
        "seeds": [0, 1, 2], "iterations": 20000, "restarts": 4, "targets": 100}
#: the levels a victim is trained at besides the target epsilons (and the prefix of a level given by its noise multiplier)
NON_PRIVATE, CLIP_ONLY, SIGMA = "none", "clip", "sigma"
HELP = ("what an uninformed attack and the informed adversary (every other training record known) recover from DP-SGD "
        "victims (Opacus) against ε, beside the exact reconstruction bound for each victim's own σ, q, T: the demo's "
        "victim (weights only) and a mini-batch SGD MLP (start known), n = 100 MNIST; memorised fraction (uninformed), "
        "targets reconstructed and the candidate game at k = 2, 8, 100 (informed), each with its 95 %% interval. CPU "
        "default: ε = ∞, clipping only, 10000, 1000, 100, 10, 1, one seed, one kkt run of 3,000 iterations per victim, "
        "10 targets (14 victims; needs pip install \"exhume[dp]\"). --settings cnn,cnn-start adds the CNN rows. --full: "
        "eight ε and the noise multipliers 0.003-0.1, the four settings, three seeds, 4 restarts of 20,000 iterations, "
        "100 targets (for a GPU). Finished cells are reused with --resume.")
#: the flags that reproduce a run (:func:`~exhume.experiments.registry.command_line`)
FLAGS = ("settings", "epsilons", "noise_multipliers", "seeds", "iterations", "restarts", "max_grad_norm", "epochs", "n", "targets")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", default=None, help=f"comma-separated: {', '.join(SETTINGS)} (default paper,minibatch)")
    p.add_argument("--epsilons", default=None, help="target ε values, comma-separated (default 10000,1000,100,10,1)")
    p.add_argument("--noise-multipliers", default=None, help="more private levels given by their noise multiplier σ, "
                   "comma-separated (their ε is the accountant's: beyond the targets, e.g. 0.01,0.1)")
    p.add_argument("--no-clip-only", action="store_true", help="leave out the clipping-only row")
    p.add_argument("--seeds", default=None, help="victim and attack seeds, comma-separated (default: --seed)")
    p.add_argument("--iterations", type=int, default=None, help="kkt iterations per restart (default 3000; --full 20000)")
    p.add_argument("--restarts", type=int, default=None, help="kkt restarts per victim (default 1; --full 4)")
    p.add_argument("--max-grad-norm", type=float, default=None, help="DP-SGD's per-sample clipping norm (default 0.1)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs of every victim (default: each setting's)")
    p.add_argument("-n", type=int, default=None, help="training images per victim (default 100)")
    p.add_argument("--targets", type=int, default=None, help="the informed adversary's targets per victim, each with "
                   "every other training record known (default 10; --full 100)")
    p.add_argument("--resume", action="store_true", help="reuse the finished cells in --out and continue the one in progress")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the CPU default or ``--full``, with the flags given on top (checked)."""
    s = {k: list(v) if isinstance(v, list) else v for k, v in (FULL if args.full else DEFAULTS).items()}
    s["seeds"] = s["seeds"] if args.full else [args.seed]
    if getattr(args, "seeds", None) is not None:
        s["seeds"] = seed_list(args.seeds)
    if getattr(args, "epsilons", None) is not None:
        s["epsilons"] = sorted(positive_numbers(args.epsilons, float, "epsilons"), reverse=True)
    if getattr(args, "noise_multipliers", None) is not None:
        s["noise_multipliers"] = sorted(positive_numbers(args.noise_multipliers, float, "noise-multipliers"))
    if getattr(args, "settings", None) is not None:
        s["settings"] = [v.strip() for v in args.settings.split(",") if v.strip()]
    if not s["settings"] or any(v not in SETTINGS for v in s["settings"]):
        raise ConfigError(f"--settings must list some of {', '.join(SETTINGS)}, got {getattr(args, 'settings', None)!r}")
    for key in ("iterations", "restarts", "max_grad_norm", "epochs", "n", "targets"):
        if getattr(args, key, None) is not None:
            if not getattr(args, key) > 0:
                raise ConfigError(f"--{key.replace('_', '-')} must be > 0, got {getattr(args, key)}")
            s[key] = getattr(args, key)
    if s["targets"] > s["n"]:
        raise ConfigError(f"--targets ({s['targets']}) must be at most the training images per victim ({s['n']})")
    s["clip_only"] = not getattr(args, "no_clip_only", False)
    s["scale"] = "full" if args.full else "cpu-default"
    return s


def levels(s: dict[str, Any]) -> list[str]:
    """The privacy levels of every setting: ε = ∞, clipping only, the noise multipliers given (``sigma0.01``), then the
    target ε from the largest."""
    return [NON_PRIVATE, *([CLIP_ONLY] if s["clip_only"] else []), *(f"{SIGMA}{v:g}" for v in s.get("noise_multipliers", [])),
            *(f"{e:g}" for e in s["epsilons"])]
