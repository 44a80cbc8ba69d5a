"""exhume: reconstruct a network's training data from its weights, and measure the leak.

    import exhume
    victim = exhume.load_victim("runs/victim")
    result = exhume.attack(victim, method="kkt", seed=0)
    scores = exhume.evaluate(result, victim)

    # your own model and images (see docs/audit.md)
    verdict = exhume.audit(model, train=(x, y), unseen=x_unseen, loss="logistic", weight_decay=5e-4,
                           normalize=(0.1307, 0.3081), out="runs/audit")
"""

from exhume.api import attack
from exhume.attacks import ATTACKS, Reconstruction, get_attack, load_reconstruction
from exhume.audit import (
    AuditResult,
    audit,  # the function shadows the subpackage's name here: import from exhume.audit.<module>
)
from exhume.errors import ExhumeError
from exhume.evaluation.run import evaluate
from exhume.portfolio import run_portfolio
from exhume.victim import AttackerView, TrainConfig, Victim, load_victim, make_victim

__version__ = "0.1.0"
__all__ = [
    "ATTACKS", "AttackerView", "AuditResult", "ExhumeError", "Reconstruction", "TrainConfig", "Victim", "attack", "audit", "evaluate",
    "get_attack", "load_reconstruction", "load_victim", "make_victim", "run_portfolio",
]
