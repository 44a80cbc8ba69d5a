"""Experiments that reproduce the papers' findings; each module registers itself on import."""

from exhume.experiments import dp as _dp  # noqa: F401,E402  (registers "dp")
from exhume.experiments import init_study as _init_study  # noqa: F401,E402  (registers "init-study")

# Modules that register experiments (one import line each):
from exhume.experiments import kkt_study as _kkt_study  # noqa: E402,F401  margin, architecture, weight-decay, multiclass, width-vs-n
from exhume.experiments import law as _law  # noqa: E402,F401  (registers "law")
from exhume.experiments import tldr as _tldr  # noqa: E402,F401  (registers "tldr")
from exhume.experiments.registry import EXPERIMENTS, Experiment, get_experiment, register_experiment

__all__ = ["EXPERIMENTS", "Experiment", "get_experiment", "register_experiment"]
