"""The torch device a run asks for, refused with one clear message when this machine lacks it."""

from __future__ import annotations

from exhume.errors import ConfigError


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
