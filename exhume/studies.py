"""One study layer below ``exhume tune`` and the shared portfolio: Optuna storage, heartbeats, claiming trials.

A study lives in an SQLAlchemy database (an SQLite file by default; ``postgresql://…`` lets workers
on many machines share it). Every worker keeps a heartbeat while it runs a trial; a trial whose
worker stopped beating for ``grace_period`` seconds is failed and queued again with the same
parameters and user attributes (Optuna's ``RetryHeartbeatStaleTrialCallback``), so a killed worker
loses only its running trial. :func:`work` is the one loop every worker runs: fail the stale
trials, then claim and run one trial, wait for the ones running elsewhere, or stop, as the caller
decides. Optuna is an optional extra (``pip install 'exhume[tune]'``), imported only here.
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from exhume.errors import ConfigError

HEARTBEAT_INTERVAL = 5
GRACE_PERIOD = 20
SCHEMA_RACE_RETRIES = 5
URL_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+psycopg2://", "mysql://", "mysql+pymysql://")


def load_optuna():
    """The ``optuna`` module, quiet (warnings only, its experimental heartbeats not flagged); one line if it is missing."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("exhume tune needs Optuna: pip install 'exhume[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    trials_log = logging.getLogger("optuna.study._optimize")
    if _not_a_failed_trial not in trials_log.filters:
        trials_log.addFilter(_not_a_failed_trial)
    return optuna


def _not_a_failed_trial(record: logging.LogRecord) -> bool:
    """Optuna's warning that a trial failed, with its traceback, is not shown: every exception but a numerical
    failure leaves the objective and reaches exhume's own one line (an interrupt: its own line too)."""
    return " failed with " not in record.getMessage()


def storage_url(storage: str | None, out: Path) -> str:
    """The database of a study: ``storage`` (checked) or the SQLite file ``out/tune.db``."""
    if storage is None:
        out.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(out / 'tune.db').resolve()}"
    if not any(storage.startswith(p) for p in URL_SCHEMES):
        raise ConfigError(f"--storage must be an SQLAlchemy URL such as postgresql://user:pass@host/db or sqlite:///path.db, got {storage!r}")
    if storage.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:  # SQLAlchemy 2.1 defaults to psycopg 3; the tune extra ships psycopg2
            return "postgresql+psycopg2://" + storage[len("postgresql://"):]
    return storage


def make_storage(storage: str | None, out: Path, heartbeat_interval: int = HEARTBEAT_INTERVAL,
                 grace_period: int = GRACE_PERIOD):
    """An Optuna RDB storage with heartbeats and retry of stale trials (SQLite in ``out`` by default)."""
    optuna = load_optuna()
    url = storage_url(storage, out)
    for attempt in range(SCHEMA_RACE_RETRIES + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeat arguments are marked experimental
            try:
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
                    engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
                )
            except ImportError as e:
                raise ConfigError(f"the storage {url.split('://')[0]!r} needs a database driver ({e}); pip install 'exhume[tune]'") from None
            except Exception as e:  # sqlalchemy's OperationalError and friends: a wrong URL, host or password
                # Workers started together on an empty database race to create Optuna's tables; the
                # loser sees a unique-constraint violation and only needs to open the storage again.
                if schema_race(e) and attempt < SCHEMA_RACE_RETRIES:
                    time.sleep(0.2 + random.random())
                    continue
                raise ConfigError(f"cannot open the study storage {redact(url)}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def schema_race(e: Exception) -> bool:
    """A worker lost the race to create Optuna's tables (unique violation or 'table ... already exists')."""
    text = str(e).lower()
    return type(e).__name__ == "IntegrityError" or "already exists" in text or "duplicate" in text


def redact(url: str) -> str:
    """``url`` without its user and password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def create_or_load(study_name: str, rdb, **kwargs):
    """``(study, created)``: the study, created by this worker if no worker has created it yet.

    Only the creating worker seeds it (enqueues its first trials), so workers started together never
    seed one study twice.
    """
    optuna = load_optuna()
    try:
        return optuna.create_study(study_name=study_name, storage=rdb, direction="maximize", **kwargs), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(study_name=study_name, storage=rdb, **kwargs), False


def open_study(storage: str | None, out: str | Path, study_name: str):
    """An existing study, for reading (one line when there is no database or no such study in it)."""
    optuna = load_optuna()
    out = Path(out)
    if storage is None and not (out / "tune.db").is_file():
        raise ConfigError(f"{out / 'tune.db'} is missing; expected a folder written by 'exhume tune' (or pass --storage)")
    rdb = make_storage(storage, out)
    try:
        return optuna.load_study(study_name=study_name, storage=rdb)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(rdb)]
        raise ConfigError(f"no study named {study_name!r} in the storage; found: {', '.join(names) or 'none'}") from None


def counts(study) -> dict[str, int]:
    """How many trials are complete, pruned, running, waiting and failed."""
    optuna = load_optuna()
    S = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    return {s.name.lower(): sum(t.state == s for t in trials) for s in (S.COMPLETE, S.PRUNED, S.RUNNING, S.WAITING, S.FAIL)}


def has_waiting(study) -> bool:
    """Whether a queued trial waits for a worker."""
    optuna = load_optuna()
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def work(study, objective: Callable, decide: Callable[[], str], poll_seconds: float = min(HEARTBEAT_INTERVAL, 2),
         held: bool = False) -> None:
    """The worker's loop: fail the stale trials (their workers died: queued again), then as ``decide()`` says,
    ``"run"`` one trial here (a waiting one, or a new one from the sampler), ``"wait"`` for trials running
    elsewhere, or ``"done"``. ``held``: Optuna's bookkeeping of a trial is held whole against interrupts
    (:func:`exhume.interrupts.whole_step`; the objective lets them through in its own part), so that an
    interrupt never leaves a trial running in the study for its heartbeat's grace period."""
    from exhume.interrupts import whole_step

    optuna = load_optuna()
    while True:
        optuna.storages.fail_stale_trials(study)
        what = decide()
        if what == "done":
            return
        if what == "run":
            try:
                with whole_step() if held else nullcontext():
                    study.optimize(objective, n_trials=1, catch=())
            except ValueError as e:  # SQLite does not lock a claimed trial: two workers can pop the same waiting one
                if "Cannot tell a COMPLETE trial" not in str(e):
                    raise
                # the other worker ran the same trial (same seed and settings: the same result) and told it first
        else:
            time.sleep(poll_seconds)
