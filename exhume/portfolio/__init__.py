"""Runs of runs: a restart portfolio above the attacks, beside ``tune`` (docs/DESIGN.md, "The rooms above and below").

An attack stays one run from one seed; the portfolio decides how many restarts, with which
settings (:mod:`exhume.portfolio.variants`), where they run (local worker processes, or any number
of machines sharing one study: :mod:`exhume.portfolio.shared`), where their results are kept
(:mod:`exhume.portfolio.store`) and how they are pooled into one Reconstruction with provenance
(:mod:`exhume.portfolio.pool`).
"""

from exhume.portfolio.plan import Plan, Restart, default_workers, make_plan
from exhume.portfolio.pool import DUPLICATE_NCC, near_duplicates, pool, starved
from exhume.portfolio.run import run_portfolio
from exhume.portfolio.variants import DEFAULT_VARIANTS, default_restarts, has_plan

__all__ = ["DEFAULT_VARIANTS", "DUPLICATE_NCC", "Plan", "Restart", "default_restarts", "default_workers", "has_plan",
           "make_plan", "near_duplicates", "pool", "portfolio_worker", "run_portfolio", "starved"]


def portfolio_worker(*args, **kwargs):
    """See :func:`exhume.portfolio.shared.portfolio_worker` (Optuna is needed only for shared studies)."""
    from exhume.portfolio.shared import portfolio_worker as _worker

    return _worker(*args, **kwargs)
