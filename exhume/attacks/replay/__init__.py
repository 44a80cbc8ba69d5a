"""The owner's training run replayed from a known start (``simulate``, :mod:`~exhume.attacks.replay.simulate`) and its
Levenberg–Marquardt solver (:mod:`~exhume.attacks.replay.lm`); the run's maths is :mod:`exhume.equations.exact`."""

from exhume.attacks.replay.simulate import SimulateAttack

__all__ = ["SimulateAttack"]
