"""Turn an architecture spec (a string on the CLI, a dict in victim.json) into an ``nn.Module``.

Spec strings: ``mlp:1000,1000`` (bias-free MLP with those hidden widths), options after ``;``:
``mlp:1000,1000;bias=first`` (bias in the first layer only), ``bias=all``, ``bias=none``,
``init=1e-4`` (first-layer N(0,1)·scale initialisation), e.g. ``mlp:256,256;bias=none;init=1e-4``.

Runkel et al.'s victims: ``affine`` (``x·θ_w + θ_b``; ``affine;bias=none`` drops ``θ_b``) and the
one-hidden-layer ReLU network with biases, ``mlp:W;bias=all`` (they use W = 6144 on CIFAR-10).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from torch import nn

from exhume.errors import ConfigError
from exhume.models.affine import Affine, affine_in_features
from exhume.models.mlp import MLP


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


def _build_affine(spec: dict[str, Any], input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    bias = spec.get("bias", "all")
    if bias not in ("all", "none"):
        raise ConfigError(f"affine bias must be 'all' or 'none', got {bias!r}")
    return Affine(affine_in_features(input_shape), out_features, bias=bias == "all")


ARCHITECTURES: dict[str, Callable[[dict[str, Any], tuple[int, ...], int], nn.Module]] = {
    "mlp": _build_mlp,
    "affine": _build_affine,
}


def parse_arch(text: str) -> dict[str, Any]:
    """Parse ``mlp:256,256;bias=first;init=1e-4`` into a spec dict."""
    head, *opts = [t.strip() for t in str(text).split(";")]
    kind, _, body = head.partition(":")
    kind = kind.strip().lower()
    if kind not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture {kind!r} in {text!r}; known: {sorted(ARCHITECTURES)}")
    spec: dict[str, Any] = {"type": kind}
    if kind == "mlp":
        try:
            spec["widths"] = [int(w) for w in body.split(",") if w.strip()]
        except ValueError:
            raise ConfigError(f"mlp widths must be integers separated by commas, got {body!r}") from None
        if not spec["widths"] or min(spec["widths"]) < 1:
            raise ConfigError(f"mlp needs at least one positive hidden width, got {body!r}")
    elif kind == "affine" and body.strip():
        raise ConfigError(f"affine takes no widths, got {text!r}; write 'affine' or 'affine;bias=none'")
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
