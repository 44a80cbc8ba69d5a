"""Bilevel reconstruction with implicit differentiation (Runkel et al.; docs/METHODS.md §2): the attack and its lower level."""

from exhume.attacks.bilevel.attack import BilevelAttack

__all__ = ["BilevelAttack"]
