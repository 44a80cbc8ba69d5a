"""What a model's modules receive or give on a forward pass: the one hook every reader of a layer uses."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


class Tap:
    """Forward hooks on the modules ``names`` of ``model``, removed on exit (or :meth:`remove`): while ``active``, each pass
    through module ``name`` keeps what it receives (``keep="input"``: its first argument) or gives (``"output"``) in
    ``seen[name]``, or hands ``(name, module, inputs, output)`` to ``take``."""

    def __init__(self, model: nn.Module, names: Iterable[str], keep: str = "input", take: Callable[..., None] | None = None) -> None:
        modules = dict(model.named_modules())
        self.seen: dict[str, Any] = {}
        self.active = True
        self._take = take or (lambda name, module, args, out: self.seen.__setitem__(name, args[0] if keep == "input" else out))
        self._handles = [modules[n].register_forward_hook(functools.partial(self._hook, n)) for n in names]

    def _hook(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.active:
            self._take(name, module, args, output)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def features_of(model: nn.Module, layer: str, x: torch.Tensor) -> torch.Tensor:
    """What module ``layer`` receives when ``model`` runs on ``x``, one row per input."""
    with Tap(model, [layer]) as tap:
        model(x)
    return tap.seen[layer].reshape(x.shape[0], -1)
