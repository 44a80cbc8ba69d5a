"""``run_portfolio``: spend one budget on several restarts of an attack and pool their candidates."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from exhume.attacks import DEFAULT_METHOD, Reconstruction, RestartRecord
from exhume.deadline import NEVER, Deadline
from exhume.errors import ConfigError
from exhume.files.runfolder import fingerprint
from exhume.portfolio import sizing as sizing_mod
from exhume.portfolio.batched import Batching
from exhume.portfolio.plan import DEFAULT_STUDY, Plan, default_workers, make_plan
from exhume.portfolio.pool import DUPLICATE_NCC, pool
from exhume.portfolio.store import LocalStore
from exhume.portfolio.variants import variants_for
from exhume.request import Request, deadline_of, view_of


def run_portfolio(victim, method: str = DEFAULT_METHOD, *, request: Request | None = None, seed: int = 0,
                  storage: str | None = None, study_name: str | None = None, variants: list[dict[str, Any]] | None = None,
                  progress: bool = True, merge_threshold: float = DUPLICATE_NCC, deadline: Deadline | None = None,
                  **settings: Any) -> Reconstruction:
    """Run the restarts of the attack ``method`` that ``request`` asks for and return one pooled Reconstruction.

    ``request`` (:class:`exhume.request.Request`, or its settings as flat keywords: ``max_seconds``,
    ``restarts``, ``workers``, ``out``, ``resume``, ``start``, ...); the other keywords are the attack's
    parameters. Each restart is one run of the registered attack from its own seed (``seed + k``) with the
    variant ``variants[k % len]`` (default :data:`exhume.portfolio.variants.DEFAULT_VARIANTS`)
    applied over the attack's parameters; ``max_seconds`` is the budget of the whole portfolio from this call on
    (``deadline``: a :class:`~exhume.deadline.Deadline` given by the caller instead), its pooling's reserve kept
    aside and the rest split over waves of ``workers`` parallel restarts (default: the local cores, at most 8); an
    ``iterations`` budget applies to each restart. ``restarts``: a number, or ``"auto"``/None
    (:mod:`exhume.portfolio.sizing`: with a time budget the attack's iteration rate is probed first
    and the restarts get enough iterations each; without one, one restart per worker).

    With ``out``, every restart is stored in ``OUT/restarts/<k>/`` as soon as it finishes and the
    pooled result in ``OUT``; ``resume`` reuses the finished restarts and continues an
    interrupted one from its checkpoint. With ``storage`` (an Optuna/SQLAlchemy URL such as
    ``postgresql://…`` or ``sqlite:///…``), restarts are claimed from a study named ``study_name``
    by every process that joins it (:func:`exhume.portfolio.shared.portfolio_worker` on other
    machines) and their results are stored in that database, from which this call pools.
    ``merge_threshold``: the NCC above which two same-label candidates are merged (1.0: never); image
    candidates must also have an SSIM above ``DUPLICATE_SSIM`` (0.98) with each other. The request's
    threat model: the start, in every restart's view (:func:`exhume.request.view_of`).
    ``batch_restarts``: 'auto' (on a CUDA device the restarts run as one batched problem in this process,
    :mod:`exhume.portfolio.batched`), 'on' or 'off' (worker processes).
    """
    t0 = time.perf_counter()
    request, params = Request.of(request, settings)
    deadline = deadline_of(request, deadline)  # the budget counts from here: probe, start-up, pooling, saving
    if not 0.0 <= merge_threshold <= 1.0:
        raise ConfigError(f"merge_threshold must be in [0, 1] (1 = never merge), got {merge_threshold!r}")
    asked, output = request.budget, request.output
    attack_kwargs = asked.attack_settings(method, params)
    restarts, workers, device, out, resume = asked.restarts, asked.workers, asked.device, output.folder, output.resume
    view = view_of(victim, request.threat)
    check_portfolio_memory(view, method, attack_kwargs, variants, workers, restarts, device)
    plan_kw = {"seed": seed, "variants": variants, "attack_kwargs": attack_kwargs, "every": output.every}
    sizing, seconds = None, deadline.seconds
    if restarts in (None, "auto") and deadline.bounded:
        make_plan(method, 1, max_seconds=seconds, workers=workers, **plan_kw)  # every setting is validated before the probe runs
        sizing = measured_sizing(view, method, attack_kwargs, deadline, workers, seed, device, out, resume, variants)
        restarts, workers, seconds = sizing.restarts, sizing.workers, sizing.seconds
    plan = make_plan(method, restarts, max_seconds=seconds, workers=workers, **plan_kw)
    from exhume.attacks import get_attack

    batching = Batching.choose(asked.batch_restarts, device, method, storage,
                               lambda: get_attack(method, **plan.restarts[0].kwargs).unbatched_on(view))
    if storage is None:
        ends = NEVER if not deadline.bounded else deadline.reserve(pooling_reserve(view, plan, deadline.seconds))
        results, rows = run_local(view, plan, out, resume, device, progress, batching.groups if batching.used else None, ends)
    else:
        from exhume.portfolio.shared import run_shared

        plan, results, rows = run_shared(view, plan, storage, study_name or DEFAULT_STUDY, out, resume, device, progress)
    recon = pool(view, plan, results, rows, merge_threshold)
    return _pooled(recon, victim, view, t0, batching, None if storage is None else study_name or DEFAULT_STUDY, sizing, out)


def _pooled(recon: Reconstruction, victim, view, t0: float, batching: Batching, study: str | None, sizing, out) -> Reconstruction:
    """The pooled result with the portfolio's records (whole wall time, batching, study, sizing, victim), saved in ``out``;
    the restarts' own seconds stay as ``restart_seconds_total``."""
    record = recon.record
    portfolio = replace(record.portfolio, restart_seconds_total=record.seconds, batched=batching.record(), study=study,
                        sizing=None if sizing is None else sizing.record())
    recon.record = replace(record, seconds=round(time.perf_counter() - t0, 3), portfolio=portfolio)
    victim_path = getattr(victim, "path", None)
    if victim_path is not None:
        recon.victim_path = str(victim_path)
    recon.victim_fingerprint = fingerprint(view.model)  # what exhume.evaluate checks the victim against
    if out is not None:
        recon.save(out)
    return recon


def check_portfolio_memory(view, method: str, attack_kwargs: dict[str, Any], variants, workers: int | None, restarts,
                           device: str) -> None:
    """Refuse, before the sizing probe or any restart runs, a portfolio whose restarts running side by side (one per
    worker) would need more memory than is available (:func:`exhume.attacks.engine.memory.check_memory`, one line)."""
    from exhume.attacks import get_attack
    from exhume.attacks.engine.memory import check_memory

    plan = make_plan(method, restarts if isinstance(restarts, int) else None, workers=workers, variants=variants,
                     attack_kwargs=attack_kwargs)
    runs = [get_attack(method, **r.kwargs) for r in plan.restarts[:plan.workers]]
    largest = max(runs, key=lambda a: a.peak_memory_bytes(view) or 0)
    check_memory(largest, view, device, copies=min(plan.workers, len(plan.restarts)), what="'s portfolio")


#: seconds of pooling per candidate kept aside from a time budget, at least POOL_RESERVE[0] seconds and at most the
#: share POOL_RESERVE[1] of the budget (docs/defaults.md#portfolio-pooling-reserve)
POOL_SECONDS_PER_CANDIDATE = 5e-4
POOL_RESERVE = (2.0, 0.1)


def pooling_reserve(view, plan: Plan, budget: float) -> float:
    """The seconds kept from ``budget`` for pooling and saving after the restarts (see :data:`POOL_SECONDS_PER_CANDIDATE`)."""
    from exhume.attacks import get_attack

    per = get_attack(plan.method, **plan.restarts[0].kwargs).candidate_count(view.n_train_hint or 100) or 0
    low, share = POOL_RESERVE
    return min(share * budget, max(low, POOL_SECONDS_PER_CANDIDATE * per * len(plan.restarts)))


def run_local(view, plan: Plan, out, resume: bool, device: str, progress: bool, batches: list | None = None,
              deadline: Deadline = NEVER):
    """Run the plan's unfinished restarts on this machine; returns ``(results, rows)`` by restart index.
    ``batches``: a list, to run them batched in this process (:mod:`exhume.portfolio.batched`; its records appended).
    ``deadline``: every restart ends by then, set-up and worker start-up included
    (:func:`exhume.portfolio.runner.restart_ends`; batched groups take their shares of it)."""
    from tqdm.auto import tqdm

    from exhume.portfolio.runner import run_pending

    store = LocalStore(out)
    results: dict[int, Reconstruction] = {}
    rows: dict[int, RestartRecord] = {}
    pending = []
    for r in plan.restarts:
        got = store.load(r) if resume else None
        if got is None:
            pending.append(r)
            continue
        if got[0] is not None:
            results[r.index] = got[0]
        rows[r.index] = replace(got[1], reused=True)
    parallel = min(plan.workers, len(pending)) > 1 and batches is None
    bar = tqdm(total=len(plan.restarts), initial=len(plan.restarts) - len(pending), desc=f"{plan.method} portfolio",
               unit="restart", disable=not (progress and parallel))

    def done(k: int, recon, row) -> None:
        if recon is not None:
            results[k] = recon
        rows[k] = row
        bar.update(1)
        bar.set_postfix({"last": f"#{k} {row.status if row.iterations is None else row.iterations} it"}, refresh=False)

    try:
        if batches is not None:
            from exhume.portfolio.batched import run_batched

            batches.extend(run_batched(view, plan, pending, store, resume, device, progress, done, deadline))
        else:
            run_pending(view, plan, pending, store, plan.workers, resume, device, progress and not parallel, done, deadline)
    finally:
        bar.close()
    if not results:
        errors = sorted({row.error or row.status for row in rows.values()})
        raise ConfigError(f"no restart of the {plan.method} portfolio finished: {'; '.join(errors)}")
    return results, rows


def measured_sizing(view, method: str, attack_kwargs: dict[str, Any], deadline: Deadline, workers: int | None, seed: int,
                    device: str, out, resume: bool, variants) -> sizing_mod.Sizing:
    """The restarts and workers for ``deadline``'s seconds: the stored decision on resume, else a fresh probe."""
    stored = sizing_mod.load(out) if resume else None
    if stored is not None:
        return stored
    base = {**attack_kwargs, **(variants[0] if variants else variants_for(method, fixed=attack_kwargs)[0])}
    chosen = sizing_mod.size(view, method, base, deadline, default_workers() if workers is None else workers,
                             fixed_workers=workers is not None, seed=seed, device=device)
    sizing_mod.save(out, chosen)
    return chosen
