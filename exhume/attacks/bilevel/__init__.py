"""Bilevel reconstruction with implicit differentiation (Runkel et al.): the attack (:mod:`~exhume.attacks.bilevel.attack`)
and its lower level (:mod:`~exhume.attacks.bilevel.lower_level`); docs/METHODS.md §2."""

from exhume.attacks.bilevel.attack import BilevelAttack

__all__ = ["BilevelAttack"]
