"""What every attack shares: the protocol and registry (:mod:`~exhume.attacks.engine.base`), the run skeleton
(:mod:`~exhume.attacks.engine.loop`: the step budget, the deadline, checkpoint and resume), the run record, the memory
estimate, the averaged iterates and snapshots, the image priors and the attacker-side score (docs/DESIGN.md)."""
