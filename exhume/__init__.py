"""exhume: reconstruct a network's training data from its weights, and measure the leak.

    import exhume
    victim = exhume.load_victim("runs/victim")
    result = exhume.attack(victim, method="kkt", seed=0)
    scores = exhume.evaluate(result, victim)
"""

from exhume.api import attack
from exhume.attacks import ATTACKS, Reconstruction, get_attack, load_reconstruction
from exhume.errors import ExhumeError
from exhume.evaluation.run import evaluate
from exhume.portfolio import run_portfolio
from exhume.victim import AttackerView, TrainConfig, Victim, load_victim, make_victim

__version__ = "0.1.0"
__all__ = [
    "ATTACKS", "AttackerView", "ExhumeError", "Reconstruction", "TrainConfig", "Victim", "attack", "evaluate",
    "get_attack", "load_reconstruction", "load_victim", "make_victim", "run_portfolio",
]
