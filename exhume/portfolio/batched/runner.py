"""The batched restarts group by group: the loop, the results and their records, and the groups run unbatched."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from exhume.deadline import NEVER, Deadline
from exhume.errors import DivergenceError
from exhume.portfolio.batched.engine import Member, NotBatchable, batched_step, open_batch
from exhume.portfolio.batched.policy import capacity, groups
from exhume.portfolio.plan import Restart


def run_group(view, method: str, restarts: list[Restart], store, resume: bool, device: str, progress: bool,
              deadline: Deadline, every: tuple[int | None, int | None] = (None, None)) -> list[tuple[Member, Any]]:
    """Run one group of restarts batched until ``deadline`` or their iteration budget, checkpointing and logging
    ``every`` ``(checkpoint_every, log_every)`` steps (None: the attack's); ``[(member, result)]``."""
    from exhume.attacks.engine.loop import run_loop
    from exhume.attacks.engine.priors import background_level
    from exhume.heap import retained_heap

    batch = open_batch(view, restarts, method, store, resume, device)
    starts = {m.run.start for m in batch.members}
    if len(starts) > 1:
        raise NotBatchable(f"their checkpoints stand at different iterations ({sorted(starts)})")
    lead = batch.members[0]
    cfg, start = lead.attack.config, lead.run.start
    checkpoint_every, log_every = lead.attack.cadence(*every)
    lead.problem.form.info.update(residual_traced=False, residual_trace_note="restarts batched through torch.func.vmap, eager: "
                                  "a short run by its settings (exhume.attacks.kkt.traces)")
    batch.deadline = deadline

    def save(done: int, elapsed: float) -> None:
        for mem in batch.live:
            mem.run.save(done, elapsed)

    with retained_heap(), no_tf32():
        try:
            end = run_loop(f"kkt batch of {len(restarts)}", cfg["iterations"], deadline, start, lead.run.elapsed,
                           lambda it, log, clock: batched_step(batch, it, log, clock), save,
                           log_every=log_every, checkpoint_every=checkpoint_every, progress=progress)
        except DivergenceError:  # every restart diverged: each one's error is recorded
            end = None
    tau = background_level(cfg["background"], view.mean, tuple(view.input_shape))
    out = []
    for mem in batch.members:
        if mem.error is not None or end is None:
            out.append((mem, None))
            continue
        mem.step.close(end.done)
        out.append((mem, mem.attack.result(mem.problem, end, mem.run, mem.step.tracker, tau, mem.restart.seed, "noise", view)))
    return out


@contextmanager
def no_tf32():
    """TF32 off inside (matmuls and cuDNN convolutions; cuDNN's default is on), restored after: no measurement yet
    shows TF32 gives the batched restarts equal results."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn




def run_batched(view, plan, pending: list[Restart], store, resume: bool, device: str, progress: bool, on_done,
                deadline: Deadline = NEVER) -> list[dict[str, Any]]:
    """Run ``pending`` batched, group by group (the time left until ``deadline`` split by group size); returns one
    record per group.

    A group that cannot be batched (vmap fails on the module, checkpoints at different iterations) runs
    one restart after another in this process, as ``workers=1`` does; its record says why.
    """
    from exhume.portfolio.pool import restart_record
    from exhume.portfolio.runner import HOST, run_pending

    records = []
    left = len(pending)
    cap = capacity(view, plan.method, pending[0], device) if pending else None
    for group in groups(pending, cap):
        share = deadline.share(len(group) / left)
        left -= len(group)
        try:
            done = run_group(view, plan.method, group, store, resume, device, progress, share, plan.every)
        except NotBatchable as e:
            records.append({"restarts": [r.index for r in group], "batched": False, "reason": str(e)})
            run_pending(view, plan, group, store, 1, resume, device, progress, on_done, share)
            continue
        seconds = None if share.seconds is None else round(share.seconds, 3)
        records.append({"restarts": [r.index for r in group], "batched": True, "seconds_given": seconds, "tf32": False})
        for mem, recon in done:
            if recon is None:
                row = restart_record(mem.restart, None, "diverged", HOST, batch=len(group),
                                     error=mem.error or "the batch ended without a complete step")
            else:
                recon.record = replace(recon.record, batched_restarts=len(group))
                row = restart_record(mem.restart, recon, "complete", HOST, batch=len(group))
            store.save(mem.restart, recon, row)
            on_done(mem.restart.index, recon, row)
    return records
