"""Turn an architecture spec (a string on the CLI, a dict in victim.json) into an ``nn.Module``.

Spec strings: ``mlp:1000,1000`` (bias-free MLP with those hidden widths), options after ``;``:
``mlp:1000,1000;bias=first`` (bias in the first layer only), ``bias=all``, ``bias=none``,
``init=1e-4`` (first-layer N(0,1)·scale initialisation), e.g. ``mlp:256,256;bias=none;init=1e-4``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from torch import nn

from exhume.errors import ConfigError
from exhume.models.mlp import MLP
from exhume.models.convnet import build_convnet, parse_convnet


def _build_mlp(spec: dict[str, Any], input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    widths = [int(w) for w in spec["widths"]]
    n_layers = len(widths) + 1
    bias = spec.get("bias", "none")
    if isinstance(bias, str):
        flags = {
            "none": [False] * n_layers,
            "all": [True] * n_layers,
            "first": [True] + [False] * (n_layers - 1),
        }.get(bias)
        if flags is None:
            raise ConfigError(f"mlp bias must be 'none', 'first' or 'all', got {bias!r}")
    else:
        flags = [bool(b) for b in bias]
    return MLP(
        in_features=math.prod(input_shape),
        widths=widths,
        out_features=out_features,
        bias=flags,
        first_init_scale=spec.get("init"),
    )


ARCHITECTURES: dict[str, Callable[[dict[str, Any], tuple[int, ...], int], nn.Module]] = {
    "mlp": _build_mlp,
    "convnet": build_convnet,
}

# Architectures whose spec string has its own grammar: kind -> parse(body, options, text).
SPEC_PARSERS: dict[str, Callable[[str, list[str], str], dict[str, Any]]] = {
    "convnet": parse_convnet,
}


def parse_arch(text: str) -> dict[str, Any]:
    """Parse ``mlp:256,256;bias=first;init=1e-4`` into a spec dict."""
    head, *opts = [t.strip() for t in str(text).split(";")]
    kind, _, body = head.partition(":")
    kind = kind.strip().lower()
    if kind not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture {kind!r} in {text!r}; known: {sorted(ARCHITECTURES)}")
    if kind in SPEC_PARSERS:
        return SPEC_PARSERS[kind](body, opts, text)
    spec: dict[str, Any] = {"type": kind}
    if kind == "mlp":
        try:
            spec["widths"] = [int(w) for w in body.split(",") if w.strip()]
        except ValueError:
            raise ConfigError(f"mlp widths must be integers separated by commas, got {body!r}") from None
        if not spec["widths"] or min(spec["widths"]) < 1:
            raise ConfigError(f"mlp needs at least one positive hidden width, got {body!r}")
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ConfigError(f"architecture option {opt!r} must look like key=value")
        key = key.strip()
        if key == "bias":
            spec["bias"] = value.strip()
        elif key == "init":
            try:
                spec["init"] = float(value)
            except ValueError:
                raise ConfigError(f"init must be a number, got {value!r}") from None
        else:
            raise ConfigError(f"unknown architecture option {key!r} in {text!r}; known: bias, init")
    return spec


def build_model(spec: dict[str, Any] | str, input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    if isinstance(spec, str):
        spec = parse_arch(spec)
    kind = spec.get("type")
    if kind not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture type {kind!r}; known: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[kind](spec, tuple(input_shape), out_features)
