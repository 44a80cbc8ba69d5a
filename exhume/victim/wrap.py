"""The conventions between a user's model and exhume, as one wrapper module.

exhume's attacks see a model that takes *centred* images ``x − mean`` (display images ``x`` in
[0, 1]) and returns one number per image for a binary task (``margin = y·Φ``, ``y = ±1``) or ``K``
logits for a multiclass one. A model trained on normalised inputs ``(x − mean) / std`` with one
or two output logits is wrapped so::

    Audited(model, std, head)(x − mean) = head(model((x − mean) / std))

- **normalisation**: ``mean`` goes to the attacker's view (the attack adds it back to show its
  candidates as images); ``std`` is a buffer of the wrapper, so the parameters ``θ`` the
  stationarity equation is about are exactly the user's, unchanged (folding ``1/std`` into the
  first layer would change ``θ`` and break the equation). ``mean`` and ``std`` may be a scalar,
  one number per channel, or a full ``(C, H, W)`` image.
- **one logit**: ``Φ(x) = logit`` (shape ``(N,)``), label ``+1`` for the positive class (by
  default the larger label, e.g. 1 of {0, 1}: BCE-with-logits' ``sigmoid(logit) = P(y = 1)``).
- **two logits** (cross-entropy over 2 classes): ``Φ(x) = logit[pos] − logit[neg]``; the
  cross-entropy of the two logits is exactly the logistic loss of this margin, so the binary
  attack and equations apply unchanged. ``pos`` is the positive class (default 1).
- **K > 2 logits**: passed through (multiclass, cross-entropy).

``exhume audit`` builds this wrapper from ``--normalize`` and the model's output count; an
:class:`~exhume.victim.AttackerView` with ``task="binary"`` wraps a two-logit model itself (positive
class 1). A scalar or per-channel ``mean`` is broadcast to the input shape.
"""

from __future__ import annotations

import torch
from torch import nn


class Audited(nn.Module):
    """``head(model((x − mean) / std))`` for centred inputs ``x − mean``; see the module docstring."""

    def __init__(self, model: nn.Module, std: torch.Tensor, head: str = "logit", positive: int = 1) -> None:
        super().__init__()
        if head not in ("logit", "two-logit", "logits"):
            raise ValueError(f"unknown head {head!r}")
        self.model = model
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        self.head = head
        self.positive = int(positive)

    def forward(self, centred: torch.Tensor) -> torch.Tensor:
        out = self.model(centred / self.std.to(centred.dtype))
        if self.head == "logit":
            return out.reshape(out.shape[0])
        if self.head == "two-logit":
            out = out.reshape(out.shape[0], 2)
            return out[:, self.positive] - out[:, 1 - self.positive]
        return out.reshape(out.shape[0], -1)


def two_logit_probe(model: nn.Module, input_shape: tuple[int, ...]) -> bool:
    """Whether ``model`` returns two logits per input (one forward pass on a zero image, in eval mode)."""
    p = next(model.parameters(), None)
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            out = model(torch.zeros(1, *input_shape, dtype=p.dtype if p is not None else torch.float32,
                                    device=p.device if p is not None else "cpu"))
    except Exception:  # noqa: BLE001 - a model that cannot run here is reported by the attack itself
        return False
    finally:
        model.train(was)
    return isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] == 2
