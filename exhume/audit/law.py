"""Where a model sits against the law of data reconstruction: its trained parameters ``p`` against ``d·n``.

Iurada, Bombari, Tommasi and Mondelli ("A Law of Data Reconstruction for Random Features (and
Beyond)", 2026) show that once the trained parameters outnumber the data's dimension times the
number of training samples, ``p ≫ d·n``, what training added to the weights (the start known)
determines every training sample: proven for random features, measured on two-layer networks and
ResNets. :func:`law_record` is the count an audit reports beside its verdict (``metrics.json``'s
``law``; docs/audit.md says what it means and what it does not).
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from exhume.starts import frozen_names

#: p/(d·n) at and above which the model is in the law's regime (the count alone; the theorem asks p ≫ d·n)
LAW_THRESHOLD = 1.0


def trained_parameters(model: nn.Module, start: dict | None) -> tuple[int, str]:
    """``(p, how it was counted)``: with a start, the parameters training changed (those bit-equal to their start are
    frozen); without one, every parameter (nothing tells a frozen one apart)."""
    params = dict(model.named_parameters())
    if start is None:
        return sum(v.numel() for v in params.values()), "every parameter (no start to tell a frozen one apart)"
    frozen = set(frozen_names(model, start))
    p = sum(v.numel() for k, v in params.items() if k not in frozen)
    return p, f"the parameters that differ from the start ({len(frozen)} tensors equal to it left out)"


def law_record(model: nn.Module, start: dict | None, input_shape, n: int) -> dict[str, Any]:
    """``{"p", "d", "n", "p_over_dn", "regime", "p_counted", "definition"}`` for a model trained on ``n`` inputs of ``input_shape``."""
    p, counted = trained_parameters(model, start)
    d = math.prod(int(s) for s in input_shape)
    ratio = p / (d * max(int(n), 1))
    regime = ("above the law's threshold (p ≥ d·n): what training added can determine every training sample"
              if ratio >= LAW_THRESHOLD else "below the law's threshold (p < d·n): what training added cannot determine "
              "every training sample, other inputs explain it as well")
    return {"p": p, "d": d, "n": int(n), "p_over_dn": round(ratio, 4), "regime": regime, "p_counted": counted,
            "definition": "p trained parameters, d = input dimension, n = training samples; the law of data reconstruction "
                          "(random features proven, deeper networks measured) needs p ≫ d·n and the start known"}
