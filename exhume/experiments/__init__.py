"""Experiments that reproduce the papers' findings; each module registers itself on import."""

from exhume.experiments.registry import EXPERIMENTS, Experiment, get_experiment, register_experiment

# Modules that register experiments (one import line each):
from exhume.experiments import tldr as _tldr  # noqa: E402,F401  (registers "tldr")

__all__ = ["EXPERIMENTS", "Experiment", "get_experiment", "register_experiment"]
