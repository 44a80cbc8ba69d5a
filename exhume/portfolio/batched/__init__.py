"""A portfolio's restarts as one batched problem in one process: how one GPU is filled.

Spawned worker processes share a GPU badly (a CUDA context each, small kernels side by side).
Here the restarts of a group run in lock-step: their candidates are stacked ``(R, m, …)`` and one
call of ``torch.func.vmap`` over the restart dimension evaluates every restart's loss terms
(:func:`exhume.attacks.kkt.terms`), its own stationarity residual ``θ − Σ_{j∈r} λ_j ∇_θ h_j``
included (so one restart's candidates never explain another's weights); one backward pass of the
sum gives each restart exactly its own gradients. The rest of each restart's step is the single
run's own (:meth:`exhume.attacks.kkt.Step.advance`): its optimisers (a variant's ``lr_lambda``),
the projection, the averaged iterates and snapshots, the history; so are its seed's starting point,
the checkpoint in ``OUT/restarts/<k>/`` (a batched restart resumes alone or batched) and the result.
At equal iterations the candidates are those of the restarts run one by one, up to rounding
(``tests/test_batched.py``, float64, every kkt setting that enters the step).

Restarts batch together when their settings differ only in :data:`PER_RESTART` (the default
variants do); other groups run one after another, the deadline's time split by their sizes. A divergent
restart leaves the batch and is recorded as diverged, as a lone one is. A module that ``vmap``
cannot run (control flow on tensor values) leaves the group to the usual path.

``batch_restarts="auto"`` (:func:`use_batched`) picks this path on a CUDA device, which one process per restart
shares badly; on CPU forked one-thread workers stay the default (docs/defaults.md#portfolio-workers; ``--batch-restarts
on`` asks for this path). TF32 stays off (:func:`no_tf32`).
"""

from exhume.portfolio.batched.policy import BATCH_CHOICES, PER_RESTART, Batching, batch_key, groups, use_batched
from exhume.portfolio.batched.runner import no_tf32, run_batched

__all__ = ["BATCH_CHOICES", "PER_RESTART", "Batching", "batch_key", "groups", "no_tf32", "run_batched", "use_batched"]
