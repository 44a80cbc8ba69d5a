"""What a model's modules receive or give on a forward pass: the one hook every reader of a layer uses.

The feature stage reads what the layer above the convolutions receives (:func:`features_of`), model inversion the
classifier's last hidden layer on every step, the evaluation each weight layer's inputs and outputs at the training
inputs. A :class:`Tap` is a context manager; its hooks come off on exit (or :meth:`Tap.remove`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

#: ``take(name, module, inputs, output)``: what a tap does on each forward pass through module ``name``
Take = Callable[[str, nn.Module, tuple[Any, ...], Any], None]


class Tap:
    """Forward hooks on the modules ``names`` of ``model``: while ``active``, each pass through module ``name`` keeps
    what it receives (``keep="input"``: its first argument) or gives (``"output"``) in ``seen[name]``, or, with
    ``take``, hands ``(name, module, inputs, output)`` to it."""

    def __init__(self, model: nn.Module, names: Iterable[str], keep: str = "input", take: Take | None = None) -> None:
        if keep not in ("input", "output"):
            raise ValueError(f"keep must be 'input' or 'output', got {keep!r}")
        modules = dict(model.named_modules())
        self.seen: dict[str, Any] = {}
        self.active = True
        self._take = take or (self._input if keep == "input" else self._output)
        self._handles = [modules[n].register_forward_hook(functools.partial(self._hook, n)) for n in names]

    def _hook(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.active:
            self._take(name, module, args, output)

    def _input(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.seen[name] = args[0]

    def _output(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.seen[name] = output

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def features_of(model: nn.Module, layer: str, x: torch.Tensor) -> torch.Tensor:
    """What module ``layer`` receives when ``model`` runs on ``x``, one row per input."""
    with Tap(model, [layer]) as tap:
        model(x)
    return tap.seen[layer].reshape(x.shape[0], -1)
