"""The Python facade: the same verbs as the CLI (train, attack, evaluate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exhume.attacks import Reconstruction, get_attack
from exhume.errors import ConfigError
from exhume.victim import AttackerView, Victim


def check_device(device: str) -> str:
    """Refuse a device this machine does not have, with one clear message."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r}; expected e.g. 'cpu', 'cuda' or 'cuda:0'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for but this machine has no CUDA GPU (torch {torch.__version__}); use --device cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device!r} is not available on this machine; use --device cpu")
    return device


def attack(victim: Victim | AttackerView, method: str = "kkt", seed: int = 0, out: str | Path | None = None,
           resume: bool = False, device: str = "cpu", progress: bool = True, **kwargs: Any) -> Reconstruction:
    """Run the attack ``method`` (a registry name) with its keyword arguments on ``victim``.

    Only the attacker's view of the victim (weights, task, loss, weight decay, input shape, data
    mean) reaches the attack. With ``out``, the attack checkpoints there and the result is saved
    there; ``resume=True`` continues from the last checkpoint.
    """
    check_device(device)
    view = victim.attacker_view() if isinstance(victim, Victim) else victim
    if not isinstance(view, AttackerView):
        raise ConfigError(f"attack() needs a Victim or AttackerView, got {type(victim).__name__}")
    atk = get_attack(method, **kwargs)
    result = atk.run(view, out=out, seed=seed, device=device, resume=resume, progress=progress)
    if isinstance(victim, Victim) and victim.path is not None:
        result.victim_path = str(victim.path)
    if out is not None:
        result.save(out)
    return result
