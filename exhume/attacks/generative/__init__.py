"""Generator-based model inversion (docs/METHODS.md §3): ``inversion``, ``tldr``, their generator and loss terms."""

from exhume.attacks.generative.inversion import InversionAttack
from exhume.attacks.generative.tldr import TLDRAttack

__all__ = ["InversionAttack", "TLDRAttack"]
