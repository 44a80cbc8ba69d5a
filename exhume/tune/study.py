"""``exhume tune``: an Optuna search over an attack's declared hyperparameters, scored attacker-side.

Each trial runs the attack (``method``) for a fixed wall-clock budget with suggested values of the
parameters that declare a search range (``Param.search``, collected by
:meth:`~exhume.attacks.engine.base.Attack.search_space`; for the default attack, :data:`SEARCH_SPACE`),
and is scored by :func:`exhume.attacks.engine.score.attacker_score`: the weights and the candidates only,
never the training set (the objective receives an :class:`~exhume.victim.AttackerView`). The first
trial of a new study is the attack's own settings (:meth:`~exhume.attacks.engine.base.Attack.search_start`),
so the selected run is never worse *by the attacker's score* than the defaults. An attack that
declares no search space is refused in one line.

Storage, heartbeats and retried trials are the study layer's (:mod:`exhume.studies`): an SQLite
file ``OUT/tune.db`` by default, ``storage="postgresql://…"`` for several workers (processes or
machines) sharing one study; a killed worker loses only the work of its running trial. ``trials``
is the study's target number of finished (complete or pruned) trials; workers stop when it is reached.

Each trial's reconstruction is saved under ``OUT/trials/trial-NNNN`` on the worker that ran it;
when the study is done, the best trial's folder is copied to ``OUT/best`` (if it is on this
worker's disk; otherwise the study's trial attributes say which host holds it).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from exhume.attacks import ATTACKS, DEFAULT_METHOD, attack_class, get_attack
from exhume.deadline import Deadline
from exhume.errors import ConfigError, DivergenceError
from exhume.interrupts import let_through, whole_step
from exhume.request import Request, view_of
from exhume.studies import GRACE_PERIOD, HEARTBEAT_INTERVAL, counts, create_or_load, load_optuna, make_storage, open_study, redact, work

__all__ = ["DEFAULTS", "GRACE_PERIOD", "HEARTBEAT_INTERVAL", "SEARCH_SPACE", "defaults_for", "load_study", "make_storage",
           "search_space", "suggest", "trial_folder", "tune"]

SCORE_NOTE = "attacker-side (weights and candidates only): (1 - relative stationarity residual) x plausible share"


def search_space(method: str = DEFAULT_METHOD) -> dict[str, tuple[float, float, bool]]:
    """``name: (low, high, log)`` for each parameter of ``method`` that declares a search range (``Param.search``)."""
    return attack_class(method).search_space()


def defaults_for(view, fixed: dict[str, Any], method: str = DEFAULT_METHOD) -> dict[str, float]:
    """The first trial of a study on ``view``: the attack's own values of the searched parameters, as they resolve there."""
    return get_attack(method, **fixed).search_start(view)


SEARCH_SPACE = search_space()
#: the first trial of a study of the default attack on a binary classifier (see :func:`defaults_for`)
DEFAULTS = defaults_for(SimpleNamespace(task="binary", loss="logistic"), {})


def _sampler(seed: int, number: int):
    """The sampler of trial ``number``: seeded by the study seed and the trial number, so every
    worker and every rerun draws fresh settings, reproducibly."""
    optuna = load_optuna()
    return optuna.samplers.TPESampler(seed=(seed * 1_000_003 + number) % 2**32, n_startup_trials=6)


def _check_settings(study, settings: dict[str, Any], created: bool) -> None:
    """Record the study's fixed settings, or refuse a worker or rerun whose settings differ."""
    if created:
        study.set_user_attr("settings", settings)
        return
    for _ in range(50):  # the creating worker writes them right after creating the study
        saved = study.user_attrs.get("settings")
        if saved is not None:
            break
        time.sleep(0.1)
    else:
        return
    diff = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if diff:
        raise ConfigError(f"study {study.study_name!r} was created with other settings ("
                          + "; ".join(f"{k}: study {saved.get(k)!r}, this run {settings.get(k)!r}" for k in diff)
                          + "); use the same settings or another --study-name / output folder")


def suggest(trial, space: dict[str, tuple[float, float, bool]] | None = None) -> dict[str, float]:
    """The trial's values of the searched parameters (default: :data:`SEARCH_SPACE`)."""
    return {name: trial.suggest_float(name, lo, hi, log=log) for name, (lo, hi, log) in (space or SEARCH_SPACE).items()}


def _searchable(view, trials: int, trial_seconds: float, fixed: dict[str, Any], method: str, threat=None):
    """The search space of ``method`` and the view with ``threat``'s start, after refusing (one line each) what no trial
    could run or score."""
    from exhume.attacks.engine.score import check_scorable
    from exhume.victim import AttackerView

    if not isinstance(view, AttackerView):
        raise ConfigError(f"tune() needs an AttackerView (the attacker never sees the training set), got {type(view).__name__}")
    view = view_of(view, threat)
    if trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {trials}")
    if not trial_seconds > 0:
        raise ConfigError(f"--trial-seconds must be positive, got {trial_seconds}")
    cls = attack_class(method)
    space = cls.search_space()
    if not space:
        searchable = sorted(name for name, c in ATTACKS.items() if c.search_space())
        raise ConfigError(f"the {method!r} attack declares no search space (no parameter with a Param.search range), so "
                          f"exhume tune has nothing to search; attacks that declare one: {', '.join(searchable) or 'none'}")
    if not cls.multipliers:
        raise ConfigError(f"exhume tune scores a run by the multipliers λ of its equation; the {method!r} attack returns none")
    clash = sorted(set(fixed) & (set(space) | {cls.budget}))
    if clash:
        raise ConfigError(f"-p {', '.join(clash)}: these are searched or set by the tuner; fix only other {method} parameters (e.g. m, dtype)")
    # unknown or invalid fixed parameters, and a victim the attack or the score cannot handle, fail
    # here with one line, before any study is touched
    get_attack(method, **fixed).check(view)
    check_scorable(view)
    return space, view


def _open(view, out: Path, storage: str | None, study_name: str, prune: bool, report_every: int, heartbeat: tuple[int, int],
          record: dict[str, Any]):
    """Create or join the study; the creating worker records the settings and queues the default trial first."""
    optuna = load_optuna()
    rdb = make_storage(storage, out, *heartbeat)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2 * report_every, interval_steps=report_every)
              if prune else optuna.pruners.NopPruner())
    # the sampler is replaced in each trial by the trial's own (see _sampler)
    with whole_step():  # a study is created and seeded whole (an interrupt in between would lose its default trial)
        study, created = create_or_load(study_name, rdb, sampler=_sampler(record["seed"], 0), pruner=pruner)
        if created:
            _seed(study, view, record)
    method = record["method"]
    _check_settings(study, record["settings"], created)
    if study.user_attrs.get("method", method) != method:
        raise ConfigError(f"study {study_name!r} searches the {study.user_attrs['method']!r} attack, not {method!r}; "
                          "use another --study-name / output folder")
    return study


def _seed(study, view, record: dict[str, Any]) -> None:
    """A new study's attributes and its first trial, the attack's own settings."""
    study.set_user_attr("method", record["method"])
    study.set_user_attr("settings", record["settings"])  # what a joining worker or a rerun must match (_check_settings)
    study.set_user_attr("target_trials", record["trials"])
    study.set_user_attr("trial_seconds", record["trial_seconds"])
    study.set_user_attr("victim", record["victim_path"])
    study.set_user_attr("score", "attacker-side: (1 - relative stationarity residual) x plausible-candidate share")
    study.enqueue_trial(defaults_for(view, record["settings"]["fixed"], record["method"]), user_attrs={"is_default": True})


def _objective(view, study, method: str, fixed: dict[str, Any], space, out: Path, trial_seconds: float, seed: int,
               device: str, report_every: int):
    """One trial: the attack for ``trial_seconds`` with the suggested settings, pruned on its attacker-side score.
    An interrupted trial (Ctrl-C, SIGTERM, a chunk's end) is failed by Optuna and queued again with its settings,
    so that the next run (the default trial included) runs it."""
    host = socket.gethostname()

    def objective(trial) -> float:
        study.sampler = _sampler(seed, trial.number)
        params = suggest(trial, space)
        folder = out / "trials" / f"trial-{trial.number:04d}"
        trial.set_user_attr("host", host)
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("folder", str(folder.resolve()))
        atk = get_attack(method, **{**fixed, **params, **attack_class(method).by_deadline()})
        try:
            with let_through():  # interruptible here, between Optuna's steps held whole (see _run_trials)
                return _trial(view, trial, atk, folder, seed, device, report_every, Deadline.after(trial_seconds))
        except KeyboardInterrupt:
            study.enqueue_trial(dict(trial.params), user_attrs={k: v for k, v in trial.user_attrs.items() if k == "is_default"})
            raise

    return objective


def _trial(view, trial, atk, folder: Path, seed: int, device: str, report_every: int, deadline: Deadline) -> float:
    """One trial's attack run until ``deadline`` (its own seconds, from its start), its score reported every
    ``report_every`` iterations (for pruning); its reconstruction saved in ``folder``; returns the attacker-side score."""
    from exhume.attacks.engine.score import attacker_score, score_reconstruction

    optuna = load_optuna()

    def on_step(it: int, seconds: float, candidates, multipliers=None, labels=None) -> None:
        value = attacker_score(view, candidates, labels, multipliers)["score"]
        trial.report(value, it)
        if trial.should_prune():
            trial.set_user_attr("pruned_at_seconds", round(seconds, 1))
            raise optuna.TrialPruned(f"score {value:.4f} at iteration {it}")

    try:
        recon = atk.run(view, seed=seed, device=device, progress=False, callback=on_step,
                        callback_every=report_every, callback_multipliers=True, deadline=deadline)
    except DivergenceError as e:  # a numerical failure: a legitimate, very bad outcome (a bad setting is not)
        trial.set_user_attr("diverged", str(e))
        return 0.0
    recon.save(folder)
    parts = score_reconstruction(view, recon)
    for k, v in parts.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("iterations", recon.record.iterations)
    return parts["score"]


def tune(view, trials: int, out: str | Path | None = None, trial_seconds: float | None = None, storage: str | None = None,
         study_name: str | None = None, seed: int = 0, device: str | None = None, prune: bool = True,
         progress: bool = True, report_every: int = 500, victim_path: str | None = None,
         heartbeat_interval: int = HEARTBEAT_INTERVAL, grace_period: int = GRACE_PERIOD,
         fixed: dict[str, Any] | None = None, method: str = DEFAULT_METHOD, *, request: Request | None = None) -> dict[str, Any]:
    """Search the hyperparameters of the attack ``method`` on ``view`` (an :class:`~exhume.victim.AttackerView`).

    Returns a summary: the best trial's number, score, parameters and folder, and the study's
    counts. ``request`` (:class:`exhume.request.Request`): the threat model (a known start, in every
    trial's view), the budget of each trial (``max_seconds``, default 60; ``device``, ``dtype``) and the
    output folder; ``out``, ``trial_seconds`` and ``device`` are the same settings given flat.
    ``fixed``: further keyword arguments of the attack shared by all trials (e.g. ``m``);
    ``study_name`` defaults to ``exhume-<method>``.
    """
    request = _asked(request, out, trial_seconds, device)
    trial_seconds, device = request.budget.max_seconds or TRIAL_SECONDS, request.budget.device
    fixed = request.budget.attack_settings(method, dict(fixed or {}))  # the budget's dtype, if set
    space, view = _searchable(view, trials, trial_seconds, fixed, method, request.threat)
    from exhume.files.runfolder import fingerprint
    from exhume.victim.start import start_digest

    study_name = study_name or f"exhume-{method}"
    out = Path(request.output.folder)
    _refuse_foreign(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"method": method, "seed": seed, "trials": trials, "trial_seconds": trial_seconds, "victim_path": victim_path,
              "settings": {"trial_seconds": float(trial_seconds), "victim_fingerprint": fingerprint(view.model),
                           "fixed": fixed, "seed": seed, "prune": prune,
                           **({} if view.start is None else {"start_digest": start_digest(view.start)})}}
    study = _open(view, out, storage, study_name, prune, report_every, (heartbeat_interval, grace_period), record)
    objective = _objective(view, study, method, fixed, space, out, trial_seconds, seed, device, report_every)
    t0 = time.perf_counter()
    _run_trials(study, objective, trials, f"tune {study_name}", progress, min(heartbeat_interval, 2))
    return _summary(study, study_name, storage, out, round(time.perf_counter() - t0, 1))


#: each trial's seconds when neither ``trial_seconds`` nor the request's budget sets them
TRIAL_SECONDS = 60.0


def _asked(request: Request | None, out, trial_seconds, device) -> Request:
    """tune's request: the flat settings sorted into one; a trial is one run bounded by its seconds, so the budget's
    iterations, restarts and workers are not tune's, and the study needs an output folder."""
    flat = {k: v for k, v in (("out", out), ("max_seconds", trial_seconds), ("device", device)) if v is not None}
    request, _ = Request.of(request, flat)
    extra = [n for n in ("iterations", "restarts", "workers") if getattr(request.budget, n) is not None]
    if extra:
        raise ConfigError(f"{', '.join(extra)}: a tune trial is one run bounded by its seconds (trial_seconds); leave them unset")
    if request.output.folder is None:
        raise ConfigError("tune writes its study and trials into a folder: give out=")
    return request


def _refuse_foreign(out: Path) -> None:
    """``out`` holds this study (continued: trials are added) or nothing of exhume's; never a victim or an attack run."""
    from exhume.files.runfolder import RUN_FILES, RunFolderError
    from exhume.victim.victim import VICTIM_FILES

    found = [n for n in (*VICTIM_FILES, *RUN_FILES, "restarts") if (out / n).exists()]
    if found:
        raise RunFolderError(f"output folder {out} holds a victim or an attack run ({', '.join(found)}); exhume tune writes "
                             "its study (tune.db, trials/, best/) into a folder of its own: choose another -o")


def _run_trials(study, objective, trials: int, desc: str, progress: bool, poll_seconds: float) -> None:
    """Work on the study until it holds ``trials`` finished trials, waiting at the end for those running elsewhere."""
    from tqdm.auto import tqdm

    bar = tqdm(total=trials, desc=desc, unit="trial", disable=not progress)

    def decide() -> str:
        c = counts(study)
        finished = c["complete"] + c["pruned"]
        bar.n = min(finished, trials)
        best = _best(study)
        bar.set_postfix({"best": f"{best.value:.4f}" if best else "-", "running": c["running"], "pruned": c["pruned"]}, refresh=True)
        if finished >= trials:
            return "done"
        if finished + c["running"] + c["waiting"] >= trials and c["waiting"] == 0:
            return "wait"  # the last trials run elsewhere: wait for them or their heartbeat to lapse
        return "run"

    work(study, objective, decide, poll_seconds, held=True)
    bar.close()


def _summary(study, study_name: str, storage: str | None, out: Path, seconds: float) -> dict[str, Any]:
    """The study's counts and best trial; the best trial's folder copied to ``out/best`` when this worker holds it."""
    best = _best(study)
    summary: dict[str, Any] = {
        "study": study_name,
        "storage": "sqlite: " + str(out / "tune.db") if storage is None else redact(storage),
        "counts": counts(study),
        "seconds": seconds,
        "score_note": SCORE_NOTE,
    }
    if best is None:
        summary.update(best_trial=None, note="no trial finished without diverging: there is no best setting")
        return summary
    summary.update(best_trial=best.number, best_score=best.value, best_params=best.params,
                   best_is_default=bool(best.user_attrs.get("is_default")), best_folder=best.user_attrs.get("folder"),
                   best_host=best.user_attrs.get("host"))
    src = trial_folder(best, out)
    if src is None:
        summary["best_not_copied"] = f"its folder {best.user_attrs.get('folder')!r} is outside {out / 'trials'}"
    elif best.user_attrs.get("host") == socket.gethostname() and src.is_dir():
        dst = out / "best"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        summary["best_copied_to"] = str(dst)
    return summary


def trial_folder(trial, out: str | Path) -> Path | None:
    """A trial's folder as recorded in the database, or None unless it lies inside ``out/trials``
    (a path read from a database never leads exhume elsewhere)."""
    folder = trial.user_attrs.get("folder")
    if not isinstance(folder, str):
        return None
    path = Path(folder).resolve()
    return path if path.is_relative_to((Path(out) / "trials").resolve()) else None


def _best(study):
    optuna = load_optuna()
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if "diverged" not in t.user_attrs]  # a diverged trial scores 0 but is never "best"
    return max(done, key=lambda t: t.value) if done else None


def load_study(storage: str | None, out: str | Path, study_name: str = f"exhume-{DEFAULT_METHOD}"):
    """Open an existing study (read-only use)."""
    return open_study(storage, out, study_name)
