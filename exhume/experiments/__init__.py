"""Experiments that reproduce the papers' findings; each module registers itself on import."""

from exhume.experiments.registry import EXPERIMENTS, Experiment, get_experiment, register_experiment

# Modules that register experiments (one import line each):
import exhume.experiments.selection  # noqa: E402,F401

__all__ = ["EXPERIMENTS", "Experiment", "get_experiment", "register_experiment"]
