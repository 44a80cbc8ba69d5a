"""Attacks, found by name: ``get_attack("kkt", lr=..., ...)``. They never read the training set.

One folder per family: ``kkt/`` (stationarity), ``bilevel/``, ``generative/`` (inversion, TLDR) and ``replay/``
(the exact run); ``engine/`` is what they share (the protocol and registry, the run skeleton, the record). Each attack
declares what the rooms above need from it (its equation, restart plan, search space, candidate count:
:class:`~exhume.attacks.engine.base.Attack`), so that no room above names an attack.
"""

from exhume.attacks import bilevel as _bilevel  # noqa: F401  (registers "bilevel")
from exhume.attacks import generative as _generative  # noqa: F401  (registers "inversion" and "tldr")
from exhume.attacks import kkt as _kkt  # noqa: F401  (registers "kkt")
from exhume.attacks import replay as _replay  # noqa: F401  (registers "simulate")
from exhume.attacks.engine.base import (
    ATTACKS,
    DEFAULT_METHOD,
    Attack,
    Param,
    Reconstruction,
    RestartPlan,
    attack_class,
    check_uses_start,
    get_attack,
    load_reconstruction,
    register,
)
from exhume.attacks.engine.record import PortfolioRecord, RestartRecord, RunRecord
from exhume.equations.kinds import Equation, SolvedEquation, Stationarity

__all__ = ["ATTACKS", "DEFAULT_METHOD", "Attack", "Equation", "Param", "PortfolioRecord", "Reconstruction", "RestartPlan", "RestartRecord",
           "RunRecord", "SolvedEquation", "Stationarity", "attack_class", "check_uses_start", "get_attack", "load_reconstruction", "register"]
