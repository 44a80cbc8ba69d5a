"""Attacks, found by name: ``get_attack("kkt", lr=..., ...)``. They never read the training set."""

from exhume.attacks import bilevel as _bilevel  # noqa: F401  (registers "bilevel")
from exhume.attacks import inversion as _inversion  # noqa: F401  (registers "inversion" and "tldr")
from exhume.attacks import kkt as _kkt  # noqa: F401  (registers "kkt")
from exhume.attacks import simulate as _simulate  # noqa: F401  (registers "simulate")
from exhume.attacks.base import ATTACKS, Attack, Param, Reconstruction, get_attack, load_reconstruction, register

__all__ = ["ATTACKS", "Attack", "Param", "Reconstruction", "get_attack", "load_reconstruction", "register"]
