"""Turn an architecture spec (a string on the CLI, a dict in victim.json) into an ``nn.Module``.

Spec strings: ``cnn:16,32;fc=64;pool=max;bias=none;act=gelu`` (see :mod:`exhume.models.cnn`),
``mlp:1000,1000`` (bias-free MLP with those hidden widths), options after ``;``:
``mlp:1000,1000;bias=first`` (bias in the first layer only), ``bias=all``, ``bias=none``,
``init=1e-4`` (first-layer N(0,1)·scale initialisation), e.g. ``mlp:256,256;bias=none;init=1e-4``.

Runkel et al.'s victims: ``affine`` (``x·θ_w + θ_b``; ``affine;bias=none`` drops ``θ_b``) and the
one-hidden-layer ReLU network with biases, ``mlp:W;bias=all`` (they use W = 6144 on CIFAR-10).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from exhume.errors import ConfigError
from exhume.files.limits import LIMITS
from exhume.models.affine import Affine
from exhume.models.cnn import ACTIVATIONS, CNN
from exhume.models.convnet import build_convnet, parse_convnet
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


def _build_cnn(spec: dict[str, Any], input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError(f"a cnn needs image inputs (C, H, W), got input shape {input_shape}")
    pool = spec.get("pool", "max")
    if pool not in ("max", "avg", "none"):
        raise ConfigError(f"cnn pool must be 'max', 'avg' or 'none', got {pool!r}")
    bias = spec.get("bias", "none")
    if bias not in ("none", "all"):
        raise ConfigError(f"cnn bias must be 'none' or 'all', got {bias!r}")
    act = spec.get("act", "relu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"cnn act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    return CNN(input_shape, spec["channels"], spec.get("fc", []), out_features, pool=pool, bias=bias == "all",
               kernel=int(spec.get("kernel", 3)), act=act)


def _build_affine(spec: dict[str, Any], input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    bias = spec.get("bias", "all")
    if bias not in ("all", "none"):
        raise ConfigError(f"affine bias must be 'all' or 'none', got {bias!r}")
    return Affine(math.prod(input_shape), out_features, bias=bias == "all")


ARCHITECTURES: dict[str, Callable[[dict[str, Any], tuple[int, ...], int], nn.Module]] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    "affine": _build_affine,
    "convnet": build_convnet,
}

# Architectures whose spec string has its own grammar: kind -> parse(body, options, text).
SPEC_PARSERS: dict[str, Callable[[str, list[str], str], dict[str, Any]]] = {
    "convnet": parse_convnet,
}


def _int_list(text: str, what: str, source: str) -> list[int]:
    try:
        values = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be integers separated by commas, got {text!r} in {source!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{what} needs at least one positive integer, got {text!r} in {source!r}")
    return values


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
    elif kind == "cnn":
        spec["channels"] = _int_list(body, "cnn channels", text)
    elif kind == "affine" and body.strip():
        raise ConfigError(f"affine takes no widths, got {text!r}; write 'affine' or 'affine;bias=none'")
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ConfigError(f"architecture option {opt!r} must look like key=value")
        key = key.strip()
        if key == "bias":
            spec["bias"] = value.strip()
        elif key in ("pool", "act") and kind == "cnn":
            spec[key] = value.strip()
        elif key == "fc" and kind == "cnn":
            spec["fc"] = _int_list(value, "cnn fc widths", text)
        elif key == "kernel" and kind == "cnn":
            spec["kernel"] = _int_list(value, "cnn kernel", text)[0]
        elif key == "init":
            try:
                spec["init"] = float(value)
            except ValueError:
                raise ConfigError(f"init must be a number, got {value!r}") from None
        else:
            known = "bias, init" + (", pool, fc, kernel, act" if kind == "cnn" else "")
            raise ConfigError(f"unknown architecture option {key!r} in {text!r}; known: {known}")
    return spec


def build_model(spec: dict[str, Any] | str, input_shape: tuple[int, ...], out_features: int) -> nn.Module:
    if isinstance(spec, str):
        spec = parse_arch(spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"an architecture spec must be a string or a dict, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture type {kind!r}; known: {sorted(ARCHITECTURES)}")
    build = ARCHITECTURES[kind]
    try:
        with torch.device("meta"):  # count the parameters before any memory is spent on them
            count = sum(p.numel() for p in build(spec, tuple(input_shape), out_features).parameters())
        if count > LIMITS.model_parameters:
            raise ConfigError(f"architecture {kind} with these widths has {count} parameters; expected at most {LIMITS.model_parameters}")
        return build(spec, tuple(input_shape), out_features)
    except (TypeError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(f"architecture spec {spec!r} cannot be built for input shape {tuple(input_shape)}: {e}") from None
