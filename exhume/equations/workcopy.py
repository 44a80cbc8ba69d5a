"""The working copy every attack (and the evaluator's checks of an attack's equation) runs on, and the facts read from
it that a portfolio's sizing probe and restarts compute once (:func:`remembered`)."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import torch


def attack_model(model: torch.nn.Module, device: str | torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A copy of the victim's module on ``device`` in ``dtype`` (eval mode) and its detached parameters.

    Every attack works on this copy, so the caller's module keeps its device, dtype and hooks.
    """
    work = copy.deepcopy(model).to(device=torch.device(device), dtype=dtype).eval()
    return work, {k: v.detach() for k, v in work.named_parameters()}


#: facts of a victim's working copies, by victim module (weakly held): ``{"state", "tensors", "facts"}``
_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remembered(victim: torch.nn.Module | None, params: dict[str, torch.Tensor], what: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, a deterministic fact ``what`` of ``params`` (the working copy of the module ``victim``), computed once.

    It is kept while the victim's parameters and buffers stay the same tensor objects, unchanged in place (in-place
    version, shape, dtype), for working copies of the same names, shapes, dtypes and device: a portfolio's sizing probe
    and its restarts in this process (and forked workers, which inherit it) pay for it once. ``victim=None`` computes.
    """
    if victim is None:
        return compute()
    tensors = victim.state_dict(keep_vars=True)
    state = tuple((k, t._version, tuple(t.shape), str(t.dtype)) for k, t in tensors.items())
    key = (what, tuple((k, tuple(v.shape), str(v.dtype), str(v.device)) for k, v in params.items()))
    try:
        memo = _FACTS.get(victim)
    except TypeError:  # a module that cannot be weakly referenced
        return compute()
    same = memo is not None and memo["state"] == state and all(r() is t for r, t in zip(memo["tensors"], tensors.values()))
    if not same:  # a changed victim (other tensors, or changed in place): its old facts are dropped
        memo = {"state": state, "tensors": [weakref.ref(t) for t in tensors.values()], "facts": {}}
        _FACTS[victim] = memo
    if key not in memo["facts"]:
        memo["facts"][key] = compute()
    return memo["facts"][key]
