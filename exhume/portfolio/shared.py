"""A portfolio spread over processes and machines through one study (:mod:`exhume.studies`, as ``exhume tune``).

The process that creates the study stores the plan in it (``study.user_attrs["plan"]``) and
enqueues one trial per restart (``user_attrs["restart"] = k``). Every worker, on any machine,
claims waiting trials (Optuna hands each one to one worker), runs that restart, and stores its
result in the study's database (:class:`exhume.portfolio.store.ResultTable`) before the trial
completes. Workers keep a heartbeat; a trial whose worker died is failed and queued again with
the same restart (the study layer's claim loop, :func:`exhume.studies.work`), and the
pooling process queues again any restart that is neither finished, waiting nor running. A retried
restart continues from its checkpoint when it runs on the machine that wrote one.

Joining processes use the plan stored in the study (the first process's settings win; a joiner
whose own settings differ is told so on stderr).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from exhume.errors import ConfigError
from exhume.portfolio.plan import Plan
from exhume.portfolio.runner import HOST, executor, run_restart
from exhume.portfolio.store import LocalStore, ResultTable
from exhume.studies import GRACE_PERIOD, HEARTBEAT_INTERVAL, create_or_load, has_waiting, load_optuna, make_storage, work

STUDY_WAIT_SECONDS = 120.0


def _create(rdb, study_name: str, plan: Plan) -> None:
    """Create the study with one waiting trial per restart and the plan (unless another process created it)."""
    study, created = create_or_load(study_name, rdb)
    if created:
        study.set_user_attr("kind", "exhume-portfolio")
        for r in plan.restarts:
            study.enqueue_trial({}, user_attrs={"restart": r.index})
        study.set_user_attr("plan", plan.record())  # written last: a joiner that sees it sees the queue


def _open(storage: str, out, study_name: str, plan: Plan | None):
    """The study (created with ``plan`` if it does not exist yet) and its plan."""
    optuna = load_optuna()
    rdb = make_storage(storage, Path(out or "."), HEARTBEAT_INTERVAL, GRACE_PERIOD)
    if plan is not None:
        _create(rdb, study_name, plan)
    deadline = time.time() + STUDY_WAIT_SECONDS
    while True:
        try:
            study = optuna.load_study(study_name=study_name, storage=rdb)
            stored = study.user_attrs.get("plan")
            if stored is not None:
                break
            if study.user_attrs.get("kind") != "exhume-portfolio" and study.trials:
                raise ConfigError(f"study {study_name!r} in the storage is not a portfolio (an 'exhume tune' study?); use another --study-name")
        except KeyError:
            pass
        if time.time() > deadline:
            raise ConfigError(f"no portfolio study {study_name!r} appeared in the storage within {STUDY_WAIT_SECONDS:.0f} s; "
                              "start the pooling 'exhume attack' (without --worker) first, or check --study-name")
        time.sleep(1.0)
    theirs = Plan.from_record(stored)
    if plan is not None and theirs.key() != plan.key():
        print(f"exhume: study {study_name!r} was created with other restarts or settings; this process runs and pools "
              f"the study's {len(theirs.restarts)} restarts", file=sys.stderr)
    return study, theirs, rdb


def _restart_objective(view, plan: Plan, table: ResultTable, local: LocalStore, resume: bool, device: str, progress: bool,
                       ran: list[int]):
    """A trial of the study: run the restart it names and store its result in the database (``ran[0]`` counts them)."""
    optuna = load_optuna()

    def objective(trial) -> float:
        k = trial.user_attrs.get("restart")
        if k is None or int(k) in table.finished():  # lost the race for the last waiting trial
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned("no restart left for this trial")
        retried = "pid" in trial.user_attrs  # copied from the trial of a worker that died
        trial.set_user_attr("host", HOST)
        trial.set_user_attr("pid", os.getpid())
        restart = plan.restarts[int(k)]
        recon, row = run_restart(view, plan.method, restart, local.folder(restart.index), resume or retried, device, progress,
                                 every=plan.every)
        table.save(restart.index, recon, row, trial.number, HOST)
        ran[0] += 1
        return float(row.iterations or 0)

    return objective


def claim_loop(view, storage: str, study_name: str, out, resume: bool, device: str, progress: bool) -> int:
    """Claim and run waiting restarts of the study until none is left; returns how many ran here."""
    study, plan, _ = _open(storage, out, study_name, None)
    table = ResultTable(storage, study_name)
    ran = [0]
    try:
        objective = _restart_objective(view, plan, table, LocalStore(out), resume, device, progress, ran)
        work(study, objective, lambda: "run" if has_waiting(study) else "done")
    finally:
        table.dispose()
    return ran[0]


def _claim_in_worker(storage: str, study_name: str, out, resume: bool, device: str) -> int:
    from exhume.portfolio.runner import _STATE

    return claim_loop(_STATE["view"], storage, study_name, out, resume, device, False)


def work_here(view, storage: str, study_name: str, workers: int, out, resume: bool, device: str, progress: bool) -> int:
    """Run this machine's share: ``workers`` processes claiming restarts (this process when 1)."""
    if workers <= 1:
        return claim_loop(view, storage, study_name, out, resume, device, progress)
    with executor(view, workers, device) as pool:
        futures = [pool.submit(_claim_in_worker, storage, study_name, out, resume, device) for _ in range(workers)]
        return sum(f.result() for f in futures)


def _requeue_missing(study, plan: Plan, table: ResultTable) -> bool:
    """Queue again every unfinished restart that no trial waits for or runs; False when all are finished."""
    optuna = load_optuna()
    S = optuna.trial.TrialState
    missing = [r.index for r in plan.restarts if r.index not in table.finished()]
    active = {t.user_attrs.get("restart") for t in study.get_trials(deepcopy=False, states=(S.WAITING, S.RUNNING))}
    for k in missing:
        if k not in active:  # its retries ran out, or its trial vanished: queue it again
            study.enqueue_trial({}, user_attrs={"restart": k})
    return bool(missing)


def run_shared(view, plan: Plan, storage: str, study_name: str, out, resume: bool, device: str, progress: bool):
    """Create or join the study, work on it, wait for every restart, and read all results from the database."""
    study, plan, rdb = _open(storage, out, study_name, plan)
    rdb.engine.dispose()  # no open connection is carried into forked workers (it reopens on next use)
    work_here(view, storage, study_name, plan.workers, out, resume, device, progress)
    table = ResultTable(storage, study_name)
    try:
        objective = _restart_objective(view, plan, table, LocalStore(out), resume, device, progress, [0])

        def decide() -> str:
            if not _requeue_missing(study, plan, table):
                return "done"
            return "run" if has_waiting(study) else "wait"  # else the last restarts run elsewhere

        work(study, objective, decide, min(HEARTBEAT_INTERVAL, 2))
        loaded = table.load_all()
    finally:
        table.dispose()
    results = {k: rec for k, (rec, _) in loaded.items() if rec is not None}
    rows = {k: row for k, (_, row) in loaded.items()}
    if not results:
        errors = sorted({row.error or row.status for row in rows.values()})
        raise ConfigError(f"no restart of the {plan.method} portfolio in study {study_name!r} finished: {'; '.join(errors)}")
    return plan, results, rows


def portfolio_worker(victim, *, storage: str, study_name: str | None = None, workers: int | None = None,
                     out: str | Path | None = None, device: str = "cpu", progress: bool = True) -> int:
    """Work on a portfolio created elsewhere (``exhume attack --storage URL --worker``): claim and run
    restarts until none is waiting, store their results in the database, and return how many ran here."""
    from exhume.device import check_device
    from exhume.portfolio.plan import DEFAULT_STUDY, default_workers
    from exhume.request import view_of

    check_device(device)
    view = view_of(victim)
    study_name = study_name or DEFAULT_STUDY
    _open(storage, out, study_name, None)  # waits for the study and its plan
    return work_here(view, storage, study_name, workers or default_workers(), out, False, device, progress)
