"""One helper shared by the tests that hold the batched path to the lone one (test_span_penalty.py, test_feature_stage.py)."""

from __future__ import annotations

from pathlib import Path

from exhume.attacks import get_attack


def batched_and_lone(view, iterations: int, folder: Path) -> tuple[list[dict], list[tuple]]:
    """Two kkt restarts of ``view`` handed to the batched path, and each beside a lone run of its seed and settings:
    ``(the batched path's records, [(batched reconstruction, lone reconstruction), …])``."""
    from exhume.portfolio import make_plan
    from exhume.portfolio.batched import run_batched
    from exhume.portfolio.store import LocalStore

    plan = make_plan("kkt", 2, workers=1, attack_kwargs={"iterations": iterations})
    done: dict = {}
    records = run_batched(view, plan, list(plan.restarts), LocalStore(folder), False, "cpu", False,
                          lambda k, recon, row: done.setdefault(k, recon))
    pairs = [(done[r.index], get_attack("kkt", **r.kwargs).run(view, progress=False, seed=r.seed)) for r in plan.restarts]
    return records, pairs
