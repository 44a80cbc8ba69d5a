"""The working copy every attack (and the evaluator's checks of an attack's equation) runs on."""

from __future__ import annotations

import copy

import torch


def attack_model(model: torch.nn.Module, device: str | torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A copy of the victim's module on ``device`` in ``dtype`` (eval mode) and its detached parameters.

    Every attack works on this copy, so the caller's module keeps its device, dtype and hooks.
    """
    work = copy.deepcopy(model).to(device=torch.device(device), dtype=dtype).eval()
    return work, {k: v.detach() for k, v in work.named_parameters()}
