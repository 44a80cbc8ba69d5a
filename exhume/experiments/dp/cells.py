"""One cell of ``exhume experiment dp``: a victim trained at one privacy level, attacked without the training set."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from exhume.attacks import DEFAULT_METHOD
from exhume.experiments.dp.cli import CLIP_ONLY, NON_PRIVATE, SETTINGS, SIGMA

#: the attack measured (one run, or --restarts pooled): the default attack, the one an audit runs
METHOD = DEFAULT_METHOD


def train_configs(setting: str, s: dict[str, Any], level: str, seed: int):
    """``(train config, DPConfig or None)`` of ``setting`` at privacy ``level``; the noise is seeded from ``seed`` (recorded:
    a research victim, replayable by whoever holds its folder)."""
    from exhume.victim import MiniBatchConfig, TrainConfig
    from exhume.victim.private import DPConfig

    given = dict(SETTINGS[setting]["train"])
    if s.get("epochs"):
        given["max_epochs" if SETTINGS[setting]["trainer"] == "full-batch" else "epochs"] = int(s["epochs"])
    train = TrainConfig(**given) if SETTINGS[setting]["trainer"] == "full-batch" else MiniBatchConfig(**given)
    if level == NON_PRIVATE:
        return train, None
    common = {"max_grad_norm": s["max_grad_norm"], "delta": s["delta"], "noise_seed": seed}
    if level == CLIP_ONLY:
        return train, DPConfig(noise_multiplier=0.0, **common)
    if level.startswith(SIGMA):
        return train, DPConfig(noise_multiplier=float(level[len(SIGMA):]), **common)
    return train, DPConfig(epsilon=float(level), **common)


def victim_of(setting: str, level: str, seed: int, s: dict[str, Any], folder: Path, resume: bool, progress: bool):
    """The victim of one cell: trained (and saved in ``folder``), or read back from it with ``resume``."""
    from exhume.victim import load_victim, make_victim

    if resume and (folder / "victim.json").is_file():
        return load_victim(folder)
    train, private = train_configs(setting, s, level, seed)
    victim = make_victim("mnist", "odd-even", s["n"], SETTINGS[setting]["arch"], train, seed=seed, progress=progress,
                         private=private, keep_start=True, public_centring=True)  # ε = ∞ too: the weights are what is measured
    victim.save(folder)
    return victim


def known_training(victim) -> dict[str, Any]:
    """The training settings an owner who kept the start knows (the known-start attack's ``training``)."""
    cfg, dp = victim.train_config, victim.privacy
    steps = dp["steps"] if dp else cfg["epochs"] * math.ceil(len(victim.train_indices) / cfg["batch_size"])
    return {"optimizer": "sgd", "lr": cfg["lr"], "momentum": cfg["momentum"], "weight_decay": cfg["weight_decay"], "steps": int(steps)}


def threat_of(victim, setting: str) -> dict[str, Any]:
    """What the attacker knows of the cell's victim besides its weights: its start and training settings, or nothing."""
    return {"start": victim.start, "training": known_training(victim)} if SETTINGS[setting]["start_known"] else {}


def attack_cell(victim, setting: str, seed: int, s: dict[str, Any], folder: Path, resume: bool, device: str, progress: bool):
    """One kkt attack of the cell's victim (checkpointed in ``folder``): weights only, or with its start and settings."""
    import exhume

    again = resume and ((folder / "checkpoint.pt").is_file() or (folder / "restarts").is_dir())
    return exhume.attack(victim, METHOD, seed=seed, restarts=s["restarts"], iterations=s["iterations"], out=folder, resume=again,
                         force=not again, device=device, progress=progress, **threat_of(victim, setting))


def exposure(victim, seed: int) -> dict[str, Any]:
    """The membership exposure from the weights: the training images against ten unseen ones each, at most 1,000
    (AUC, TPR at 1 % FPR)."""
    import numpy as np

    from exhume.data import load_dataset
    from exhume.data.tasks import select_pool
    from exhume.evaluation.weights_membership import membership_exposure

    ds = load_dataset(victim.data_spec["dataset"])
    train = victim.load_train_set(ds)
    pool = select_pool(ds, train.spec["task"], min(1000, 10 * len(train)), exclude=np.asarray(train.indices), seed=seed + 2)
    record, _ = membership_exposure(victim.attacker_view(), train.centred, train.y, pool.x - victim.mean, pool.y, seed=seed)
    score = record["scores"][record["primary"]]
    return {"membership_auc": round(score["auc"]["value"], 4), "membership_tpr_at_1pct_fpr": round(score["tpr_at_0.01_fpr"]["value"], 4)}


def uninformed_row(victim, recon, setting: str, level: str, seed: int, s: dict[str, Any]) -> dict[str, Any]:
    """The uninformed attack's row: ``exhume.evaluate`` of the run against the training set (memorised, control, verdict),
    the membership exposure, the victim's recorded privacy."""
    import exhume

    m = exhume.evaluate(recon, victim, figures=False).metrics
    dp, vm = victim.privacy or {}, victim.metrics
    return {"setting": setting, "level": level, "seed": seed, "epsilon": dp.get("epsilon") if dp else None,
            "epsilon_spent": dp.get("epsilon_spent") if dp else None, "noise_multiplier": dp.get("noise_multiplier", 0.0),
            "max_grad_norm": dp.get("max_grad_norm"), "sample_rate": dp.get("sample_rate"), "steps": dp.get("steps"),
            "train_accuracy": round(vm["train_accuracy"], 4), "test_accuracy": round(vm.get("test_accuracy", math.nan), 4),
            "memorised": m["memorised"], "control": m["memorised_control"], "control_size": m["control_size"], "n": s["n"],
            "one_to_one_ssim_mean": round(m["one_to_one_ssim_mean"], 4), "verdict": m["verdict"], "p_value": m.get("p_value"),
            **exposure(victim, seed), "iterations": recon.record.iterations}
