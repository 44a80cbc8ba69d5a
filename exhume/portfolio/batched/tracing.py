"""The batched restarts' evaluation, eager in a short run, else traced once into a graph and replayed every step."""

from __future__ import annotations

from typing import Any

import torch

from exhume.attacks.kkt import traces

#: make_fx's mode: real tensors (fake ones gave a graph whose replay failed on a view under vmap)
TRACING_MODE = "real"


def trace(f, args) -> Any:
    """``f`` traced once into a graph of tensor operations (``make_fx``) and checked against ``f`` on ``args``;
    None when it cannot be traced or its replay disagrees (as :class:`~exhume.equations.stationarity.TracedResidual`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from exhume.equations.stationarity import replay_agrees

    try:
        graph = make_fx(f, tracing_mode=TRACING_MODE, _allow_non_fake_inputs=True)(*args)
        got = graph(*args)
    except Exception:  # noqa: BLE001 - any failure to trace or replay leaves the batch eager
        return None
    return graph if replay_agrees(got, f(*args)) else None




def evaluate(batch) -> tuple[torch.Tensor, ...]:
    """:func:`~exhume.portfolio.batched.engine.value_and_gradients` at the live restarts' unknowns: eager in a short run, else replayed from its trace
    from the first step (traced again when a restart leaves the batch; :func:`exhume.attacks.kkt.traces`)."""
    args = (torch.stack([m.problem.x.detach() for m in batch.live]), torch.stack([m.problem.u.detach() for m in batch.live]))
    if batch.trace_state != "failed" and traces(batch.live[0].attack.config["iterations"], batch.deadline.seconds):
        key = (tuple(args[0].shape), tuple(args[1].shape))
        if batch.trace_state != key:
            batch.graph = trace(batch.fn, args)
            batch.trace_state = key if batch.graph is not None else "failed"
            info = batch.members[0].problem.form.info
            info.update(residual_traced=batch.graph is not None, residual_trace_note="restarts batched through torch.func.vmap, "
                        + ("traced once, replayed every step" if batch.graph is not None else "eager: the batch cannot be traced"))
        if batch.graph is not None:
            return batch.graph(*args)
    return batch.fn(*args)
