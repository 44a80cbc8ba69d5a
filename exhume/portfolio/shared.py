"""A portfolio spread over processes and machines through one Optuna study (the storage of ``tune``).

The process that creates the study stores the plan in it (``study.user_attrs["plan"]``) and
enqueues one trial per restart (``user_attrs["restart"] = k``). Every worker, on any machine,
claims waiting trials (Optuna hands each one to one worker), runs that restart, and stores its
result in the study's database (:class:`exhume.portfolio.store.ResultTable`) before the trial
completes. Workers keep a heartbeat; a trial whose worker died is failed and queued again with
the same restart (Optuna's ``RetryHeartbeatStaleTrialCallback``, as in ``exhume tune``), and the
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
from typing import Any

from exhume.errors import ConfigError
from exhume.portfolio.plan import Plan
from exhume.portfolio.runner import HOST, executor, run_restart
from exhume.portfolio.store import LocalStore, ResultTable
from exhume.tune.study import GRACE_PERIOD, HEARTBEAT_INTERVAL, _optuna, make_storage

STUDY_WAIT_SECONDS = 120.0


def _open(storage: str, out, study_name: str, plan: Plan | None):
    """The study (created with ``plan`` if it does not exist yet) and its plan."""
    import warnings

    optuna = _optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats, fail_stale_trials
    rdb = make_storage(storage, Path(out or "."), HEARTBEAT_INTERVAL, GRACE_PERIOD)
    if plan is not None:
        try:
            study = optuna.create_study(study_name=study_name, storage=rdb, direction="maximize")
            study.set_user_attr("kind", "exhume-portfolio")
            for r in plan.restarts:
                study.enqueue_trial({}, user_attrs={"restart": r.index})
            study.set_user_attr("plan", plan.record())  # written last: a joiner that sees it sees the queue
        except optuna.exceptions.DuplicatedStudyError:
            pass
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


def claim_loop(view, storage: str, study_name: str, out, resume: bool, device: str, progress: bool) -> int:
    """Claim and run waiting restarts of the study until none is left; returns how many ran here."""
    optuna = _optuna()
    study, plan, _ = _open(storage, out, study_name, None)
    table = ResultTable(storage, study_name)
    local = LocalStore(out)
    ran = 0

    def objective(trial) -> float:
        nonlocal ran
        k = trial.user_attrs.get("restart")
        if k is None or int(k) in table.finished():  # lost the race for the last waiting trial
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned("no restart left for this trial")
        retried = "pid" in trial.user_attrs  # copied from the trial of a worker that died
        trial.set_user_attr("host", HOST)
        trial.set_user_attr("pid", os.getpid())
        restart = plan.restarts[int(k)]
        recon, row = run_restart(view, plan.method, restart, local.folder(restart.index), resume or retried, device, progress)
        table.save(restart.index, recon, row, trial.number, HOST)
        ran += 1
        return float(row.get("iterations", 0))

    try:
        while _waiting(study):
            study.optimize(objective, n_trials=1, catch=())
    finally:
        table.dispose()
    return ran


def _waiting(study) -> bool:
    optuna = _optuna()
    optuna.storages.fail_stale_trials(study)
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _claim_in_worker(storage: str, study_name: str, out, resume: bool, device: str) -> int:
    from exhume.portfolio.runner import _STATE

    return claim_loop(_STATE["view"], storage, study_name, out, resume, device, False)


def work(view, storage: str, study_name: str, workers: int, out, resume: bool, device: str, progress: bool) -> int:
    """Run this machine's share: ``workers`` processes claiming restarts (this process when 1)."""
    if workers <= 1:
        return claim_loop(view, storage, study_name, out, resume, device, progress)
    with executor(view, workers, device) as pool:
        futures = [pool.submit(_claim_in_worker, storage, study_name, out, resume, device) for _ in range(workers)]
        return sum(f.result() for f in futures)


def run_shared(view, plan: Plan, storage: str, study_name: str, out, resume: bool, device: str, progress: bool):
    """Create or join the study, work on it, wait for every restart, and read all results from the database."""
    optuna = _optuna()
    study, plan, rdb = _open(storage, out, study_name, plan)
    rdb.engine.dispose()  # no open connection is carried into forked workers (it reopens on next use)
    work(view, storage, study_name, plan.workers, out, resume, device, progress)
    table = ResultTable(storage, study_name)
    S = optuna.trial.TrialState
    try:
        while True:
            optuna.storages.fail_stale_trials(study)
            missing = [r.index for r in plan.restarts if r.index not in table.finished()]
            if not missing:
                break
            active = {t.user_attrs.get("restart") for t in study.get_trials(deepcopy=False, states=(S.WAITING, S.RUNNING))}
            for k in missing:
                if k not in active:  # its retries ran out, or its trial vanished: queue it again
                    study.enqueue_trial({}, user_attrs={"restart": k})
            if _waiting(study):
                claim_loop(view, storage, study_name, out, resume, device, progress)
            else:
                time.sleep(min(HEARTBEAT_INTERVAL, 2))  # the last restarts run elsewhere
        loaded = table.load_all()
    finally:
        table.dispose()
    results = {k: rec for k, (rec, _) in loaded.items() if rec is not None}
    rows: dict[int, dict[str, Any]] = {k: row for k, (_, row) in loaded.items()}
    if not results:
        errors = sorted({row.get("error", row["status"]) for row in rows.values()})
        raise ConfigError(f"no restart of the {plan.method} portfolio in study {study_name!r} finished: {'; '.join(errors)}")
    return plan, results, rows


def portfolio_worker(victim, *, storage: str, study_name: str | None = None, workers: int | None = None,
                     out: str | Path | None = None, device: str = "cpu", progress: bool = True) -> int:
    """Work on a portfolio created elsewhere (``exhume attack --storage URL --worker``): claim and run
    restarts until none is waiting, store their results in the database, and return how many ran here."""
    from exhume.device import check_device
    from exhume.portfolio.plan import DEFAULT_STUDY, as_view, default_workers

    check_device(device)
    view = as_view(victim)
    study_name = study_name or DEFAULT_STUDY
    _open(storage, out, study_name, None)  # waits for the study and its plan
    return work(view, storage, study_name, workers or default_workers(), out, False, device, progress)
