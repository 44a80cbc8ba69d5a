"""Attacks, found by name: ``get_attack("kkt", lr=..., ...)``. They never read the training set.

Each declares what the rooms above need from it (its equation, restart plan, search space, candidate
count: :class:`~exhume.attacks.base.Attack`), so that no room above names an attack.
"""

from exhume.attacks import bilevel as _bilevel  # noqa: F401  (registers "bilevel")
from exhume.attacks import inversion as _inversion  # noqa: F401  (registers "inversion" and "tldr")
from exhume.attacks import kkt as _kkt  # noqa: F401  (registers "kkt")
from exhume.attacks import simulate as _simulate  # noqa: F401  (registers "simulate")
from exhume.attacks.base import (
    ATTACKS,
    Attack,
    Param,
    Reconstruction,
    RestartPlan,
    attack_class,
    get_attack,
    load_reconstruction,
    register,
)
from exhume.attacks.equations import Equation, Stationarity
from exhume.attacks.record import PortfolioRecord, RestartRecord, RunRecord, SolvedEquation

__all__ = ["ATTACKS", "Attack", "Equation", "Param", "PortfolioRecord", "Reconstruction", "RestartPlan", "RestartRecord", "RunRecord",
           "SolvedEquation", "Stationarity", "attack_class", "get_attack", "load_reconstruction", "register"]
