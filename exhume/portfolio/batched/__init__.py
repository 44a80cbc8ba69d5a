"""A portfolio's restarts as one batched problem in one process: how one GPU is filled (docs/portfolio.md).

The restarts of a group run in lock-step: their candidates stacked ``(R, m, …)``, one ``torch.func.vmap`` call gives
every restart its own loss terms and gradients, traced once where the run is long (:mod:`~exhume.portfolio.batched.engine`);
the rest of each restart's step, checkpoint and result is the lone run's own, so at equal iterations the candidates are
those of the restarts run one by one, up to rounding (``tests/test_batched.py``). Whether to batch and which restarts
share a batch: :mod:`~exhume.portfolio.batched.policy`; the groups run, or run unbatched where they cannot be (a module
vmap cannot run, runs that take kkt's feature stage): :mod:`~exhume.portfolio.batched.runner`. TF32 stays off.
"""

from exhume.portfolio.batched.policy import BATCH_CHOICES, PER_RESTART, Batching, batch_key, groups, use_batched
from exhume.portfolio.batched.runner import no_tf32, run_batched

__all__ = ["BATCH_CHOICES", "PER_RESTART", "Batching", "batch_key", "groups", "no_tf32", "run_batched", "use_batched"]
