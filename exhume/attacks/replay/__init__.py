"""The owner's training run replayed from a known start (``simulate``) and its Levenberg–Marquardt solver (``lm``)."""

from exhume.attacks.replay.simulate import SimulateAttack

__all__ = ["SimulateAttack"]
