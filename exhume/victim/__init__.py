"""Victims: what the attacker knows (weights, task, loss), and how the papers' victims are trained."""

from exhume.victim.build import make_minibatch_victim, make_victim
from exhume.victim.minibatch import MiniBatchConfig, train_minibatch
from exhume.victim.train import TrainConfig, stationarity_residual, train_victim
from exhume.victim.victim import AttackerView, Victim, load_victim

__all__ = ["AttackerView", "TrainConfig", "Victim", "load_victim", "make_victim", "stationarity_residual", "train_victim",
           "MiniBatchConfig", "make_minibatch_victim", "train_minibatch"]
