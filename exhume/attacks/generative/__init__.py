"""Generator-based model inversion: network inversion (:mod:`~exhume.attacks.generative.inversion`) and TLDR
(:mod:`~exhume.attacks.generative.tldr`), their conditioned generator and loss terms; docs/METHODS.md §3."""

from exhume.attacks.generative.inversion import InversionAttack
from exhume.attacks.generative.tldr import TLDRAttack

__all__ = ["InversionAttack", "TLDRAttack"]
