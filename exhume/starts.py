"""A known start's two small facts that both the victim room (which loads a start) and the attacks
(which use it) need: its digest (a run resumed with another start is refused) and the parameters
training left equal to it (a frozen feature extractor, left out of the equation)."""

from __future__ import annotations

import torch
from torch import nn


def frozen_names(model: nn.Module, start: dict[str, torch.Tensor]) -> list[str]:
    """Parameters exactly equal to their start: not trained (e.g. a frozen feature extractor)."""
    params = dict(model.named_parameters())
    return [k for k, v in start.items() if torch.equal(v.to(params[k].device, params[k].dtype), params[k].detach())]


def start_digest(start: dict[str, torch.Tensor] | None) -> str | None:
    """sha256 (16 hex digits) of a start's names and tensors: a run resumed with another start is refused."""
    if start is None:
        return None
    import hashlib

    from exhume.files.runfolder import tensors_digest

    names = hashlib.sha256("\n".join(sorted(start)).encode()).hexdigest()
    return hashlib.sha256((names + tensors_digest(*(start[k] for k in sorted(start)))).encode()).hexdigest()[:16]
