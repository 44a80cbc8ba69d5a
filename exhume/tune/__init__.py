"""Attacker-side hyperparameter search (``exhume tune``); Optuna is an optional extra."""

from exhume.attacks.engine.score import attacker_score, score_reconstruction
from exhume.tune.study import DEFAULTS, SEARCH_SPACE, load_study, tune

__all__ = ["DEFAULTS", "SEARCH_SPACE", "attacker_score", "load_study", "score_reconstruction", "tune"]
