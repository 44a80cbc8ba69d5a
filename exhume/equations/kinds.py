"""The equation an attack inverts, as a description: its kind and the parameters that pin it down.

An attack declares its ``equation`` (:class:`~exhume.attacks.engine.base.Attack`), and a run on a view with a
known start names the one it then inverts (``equation_on``). The evaluator, who holds the training
set, checks the equation's assumptions on the real training data by its type
(:mod:`exhume.evaluation.equations`); nothing here reads the training set, so a new equation is one
new description here and one new set of checks there, not a branch in either room.

- :class:`Equation`: the attack inverts no equation of the weights and the training data (model
  inversion): nothing to check;
- :class:`Stationarity`: ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``, which holds when training ended at
  (or near) a stationary point of ``mean_i ℓ_i + (w/2)‖θ‖²`` (without weight decay, near the
  max-margin KKT point) and the network is what the attack differentiates;
- :class:`KnownStart`: with the starting weights known, what training added is a sum of the
  training points' gradients (:mod:`exhume.equations.trajectory`);
- :class:`ExactRun`: the owner's whole recipe replayed on the training data reproduces the weights
  (to rounding when the recipe is the one that ran; :mod:`exhume.equations.exact`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class Equation:
    """No equation of the weights and the training data: no assumption of it to check (the base)."""

    text: str = "none: the attack inverts no equation of the weights and the training data"


@dataclass(frozen=True)
class Stationarity(Equation):
    """``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``: training ended at a stationary point (see the module docstring).

    ``multiplier_scale``: the attack sets the multipliers' scale from the weights alone, which the
    evaluator checks against the real training margins.
    """

    text: str = "θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i): a stationary point of the training objective"
    multiplier_scale: bool = False


@dataclass(frozen=True)
class KnownStart(Equation):
    """What training added from a known start, ``θ_T − c·θ_0 = Σ_i Σ_k λ_ik ∇_θ h(θ^(k); x_i)`` (gradients at the final
    weights, and with ``kind="endpoints"`` at the start too; :mod:`exhume.equations.trajectory`).

    ``view``: the attacker's view holding the start (None: the start is not at hand, e.g. ``exhume evaluate`` of
    such a run, and the check cannot be made); ``decay``, ``preconditioner``: the attack's settings of ``c`` and
    Adam's ``P``; ``formulation`` and ``nonnegative``: the attack's ``h`` and its multipliers' sign;
    ``attack_residual``: the run's final residual is this equation's (False: another quantity, e.g. simulate's).
    """

    text: str = "θ_T − c·θ_0 = Σ_i Σ_k λ_ik ∇_θ h(θ^(k); x_i): what training added to the known starting weights"
    view: Any = None
    kind: str = "endpoints"
    decay: Any = "auto"
    preconditioner: str = "auto"
    formulation: str = "auto"
    nonnegative: bool = True
    attack_residual: bool = True


@dataclass(frozen=True)
class ExactRun(Equation):
    """``θ_T = Run(θ_0; x_1 … x_n)``: the owner's whole recipe replayed from the start (:mod:`exhume.equations.exact`).

    ``view``: the attacker's view with the start and the recipe (None: not at hand, the check cannot be made).
    """

    text: str = "θ_T = Run(θ_0; x_1 … x_n): the owner's recipe replayed exactly from the start"
    view: Any = None


class SolvedEquation(str, Enum):
    """The equation a run solved (``config["equation_used"]``; absent: ``STATIONARY``)."""

    STATIONARY = "stationary"  # a stationary point of training (the KKT conditions)
    TRAJECTORY = "trajectory"  # the known-start equation on gradients at the final weights
    ENDPOINTS = "endpoints"  # the known-start equation on gradients at the start and the final weights
    SIMULATED = "simulated training"  # training simulated from the start (judged by the endpoints equation)
    EXACT_RUN = "the exact training run"  # the owner's recipe replayed

    @property
    def stationary(self) -> bool:
        """True for the stationarity equation (its multipliers have the margin relation; its residual is KKT's)."""
        return self is SolvedEquation.STATIONARY

    @property
    def known_start_kind(self) -> str | None:
        """The ``kind`` of :class:`~exhume.equations.kinds.KnownStart` that checks a run of this equation (None: stationary)."""
        if self.stationary:
            return None
        return SolvedEquation.ENDPOINTS.value if self is SolvedEquation.SIMULATED else self.value
