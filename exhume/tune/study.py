"""``exhume tune``: an Optuna search over the kkt attack's hyperparameters, scored attacker-side.

Each trial runs the kkt attack for a fixed wall-clock budget with suggested values of the
parameters that declare a search range (``Param.search`` in :mod:`exhume.attacks.kkt`: ``lr``,
``lr_lambda``, ``lambda_min``, ``alpha`` and ``init_scale``, log-uniform around the measured
defaults; collected in :data:`SEARCH_SPACE`), and is scored by :func:`exhume.tune.score.attacker_score` — the weights and
the candidates only, never the training set (the objective receives an
:class:`~exhume.victim.AttackerView`). The first trial of a new study is the default settings, so
the selected run is never worse *by the attacker's score* than the defaults.

Storage, heartbeats and retried trials are the study layer's (:mod:`exhume.studies`): an SQLite
file ``OUT/tune.db`` by default, ``storage="postgresql://…"`` for several workers (processes or
machines) sharing one study; a killed worker loses only the work of its running trial. ``trials`` is the study's target number of finished
(complete or pruned) trials; workers stop when it is reached.

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
from typing import Any

from exhume.attacks import ATTACKS
from exhume.attacks.formulation import form_for
from exhume.attacks.kkt import LR_LAMBDA_MARGIN, resolve_lr_lambda
from exhume.errors import ConfigError, DivergenceError
from exhume.studies import GRACE_PERIOD, HEARTBEAT_INTERVAL, make_storage, open_study, redact
from exhume.studies import load_optuna as _optuna


def search_space(method: str = "kkt") -> dict[str, tuple[float, float, bool]]:
    """``name: (low, high, log)`` for each parameter of ``method`` that declares a search range (``Param.search``)."""
    return {name: (p.search[0], p.search[1], p.search[2] == "log") for name, p in ATTACKS[method].params.items() if p.search}


SEARCH_SPACE = search_space("kkt")
#: the first trial of a study: kkt's defaults, ``lr_lambda="auto"`` as it resolves for a classifier (see :func:`defaults_for`)
DEFAULTS = {name: ATTACKS["kkt"].params[name].default for name in SEARCH_SPACE} | {"lr_lambda": LR_LAMBDA_MARGIN}


def defaults_for(view, fixed: dict[str, Any]) -> dict[str, float]:
    """:data:`DEFAULTS` for this victim: ``lr_lambda`` as kkt's ``"auto"`` resolves it for the formulation it will use."""
    form = form_for(view, fixed.get("formulation", "auto"), fixed.get("loss"))
    return {**DEFAULTS, "lr_lambda": resolve_lr_lambda("auto", form)}


def _sampler(seed: int, number: int):
    """The sampler of trial ``number``: seeded by the study seed and the trial number, so every
    worker and every rerun draws fresh settings, reproducibly."""
    optuna = _optuna()
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


def suggest(trial) -> dict[str, float]:
    return {name: trial.suggest_float(name, lo, hi, log=log) for name, (lo, hi, log) in SEARCH_SPACE.items()}


def _counts(study) -> dict[str, int]:
    optuna = _optuna()
    S = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    return {s.name.lower(): sum(t.state == s for t in trials) for s in (S.COMPLETE, S.PRUNED, S.RUNNING, S.WAITING, S.FAIL)}


def tune(view, trials: int, out: str | Path, trial_seconds: float = 60.0, storage: str | None = None,
         study_name: str = "exhume-kkt", seed: int = 0, device: str = "cpu", prune: bool = True,
         progress: bool = True, report_every: int = 500, victim_path: str | None = None,
         heartbeat_interval: int = HEARTBEAT_INTERVAL, grace_period: int = GRACE_PERIOD,
         fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Search the kkt attack's hyperparameters on ``view`` (an :class:`~exhume.victim.AttackerView`).

    Returns a summary: the best trial's number, score, parameters and folder, and the study's
    counts. ``fixed``: further kkt keyword arguments shared by all trials (e.g. ``m``).
    """
    from exhume.victim import AttackerView

    if not isinstance(view, AttackerView):
        raise ConfigError(f"tune() needs an AttackerView (the attacker never sees the training set), got {type(view).__name__}")
    if trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {trials}")
    if not trial_seconds > 0:
        raise ConfigError(f"--trial-seconds must be positive, got {trial_seconds}")
    fixed = dict(fixed or {})
    clash = sorted(set(fixed) & (set(SEARCH_SPACE) | {"iterations", "max_seconds"}))
    if clash:
        raise ConfigError(f"-p {', '.join(clash)}: these are searched or set by the tuner; fix only other kkt parameters (e.g. m, dtype)")
    optuna = _optuna()
    from tqdm.auto import tqdm

    from exhume.attacks import get_attack
    from exhume.tune.score import attacker_score, check_scorable, score_reconstruction

    # unknown or invalid fixed parameters, and a victim the attack or the score cannot handle, fail
    # here with one line, before any study is touched
    get_attack("kkt", **fixed).check(view)
    check_scorable(view)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rdb = make_storage(storage, out, heartbeat_interval, grace_period)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2 * report_every, interval_steps=report_every)
              if prune else optuna.pruners.NopPruner())
    sampler = _sampler(seed, 0)  # replaced in each trial by the trial's own (see _sampler)
    try:  # only the worker that creates the study seeds it (no race between workers starting together)
        study = optuna.create_study(study_name=study_name, storage=rdb, direction="maximize", sampler=sampler, pruner=pruner)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=rdb, sampler=sampler, pruner=pruner)
        created = False
    from exhume.files.runfolder import fingerprint

    _check_settings(study, {"trial_seconds": float(trial_seconds), "victim_fingerprint": fingerprint(view.model),
                            "fixed": fixed, "seed": seed, "prune": prune}, created)
    if created:
        study.set_user_attr("target_trials", trials)
        study.set_user_attr("trial_seconds", trial_seconds)
        study.set_user_attr("victim", victim_path)
        study.set_user_attr("score", "attacker-side: (1 - relative stationarity residual) x plausible-candidate share")
        study.enqueue_trial(defaults_for(view, fixed), user_attrs={"is_default": True})
    host = socket.gethostname()

    def objective(trial) -> float:
        study.sampler = _sampler(seed, trial.number)
        params = suggest(trial)
        folder = out / "trials" / f"trial-{trial.number:04d}"
        trial.set_user_attr("host", host)
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("folder", str(folder.resolve()))
        atk = get_attack("kkt", **{**fixed, **params, "iterations": 10_000_000, "max_seconds": float(trial_seconds)})

        def on_step(it: int, seconds: float, candidates, multipliers=None) -> None:
            labels = _labels(candidates.shape[0])
            value = attacker_score(view, candidates, labels, multipliers)["score"]
            trial.report(value, it)
            if trial.should_prune():
                trial.set_user_attr("pruned_at_seconds", round(seconds, 1))
                raise optuna.TrialPruned(f"score {value:.4f} at iteration {it}")

        try:
            recon = atk.run(view, seed=seed, device=device, progress=False, callback=on_step,
                            callback_every=report_every, callback_multipliers=True)
        except DivergenceError as e:  # a numerical failure: a legitimate, very bad outcome (a bad setting is not)
            trial.set_user_attr("diverged", str(e))
            return 0.0
        recon.save(folder)
        parts = score_reconstruction(view, recon)
        for k, v in parts.items():
            trial.set_user_attr(k, v)
        trial.set_user_attr("iterations", recon.summary["iterations"])
        return parts["score"]

    def _labels(m: int):
        import torch

        from exhume.attacks.formulation import binary_labels

        return binary_labels(m, torch.float32)

    t0 = time.perf_counter()
    bar = tqdm(total=trials, desc=f"tune {study_name}", unit="trial", disable=not progress)
    while True:
        optuna.storages.fail_stale_trials(study)
        c = _counts(study)
        finished = c["complete"] + c["pruned"]
        bar.n = min(finished, trials)
        best = _best(study)
        bar.set_postfix({"best": f"{best.value:.4f}" if best else "-", "running": c["running"], "pruned": c["pruned"]}, refresh=True)
        if finished >= trials:
            break
        if finished + c["running"] + c["waiting"] >= trials and c["waiting"] == 0:
            time.sleep(min(heartbeat_interval, 2))  # the last trials run elsewhere: wait for them or their heartbeat to lapse
            continue
        study.optimize(objective, n_trials=1, catch=())
    bar.close()
    best = _best(study)
    summary: dict[str, Any] = {
        "study": study_name,
        "storage": "sqlite: " + str(out / "tune.db") if storage is None else redact(storage),
        "counts": _counts(study),
        "seconds": round(time.perf_counter() - t0, 1),
        "score_note": "attacker-side (weights and candidates only): (1 - relative stationarity residual) x plausible share",
    }
    if best is None:
        summary.update(best_trial=None, note="no trial finished without diverging: there is no best setting")
    else:
        summary.update(best_trial=best.number, best_score=best.value, best_params=best.params,
                       best_is_default=bool(best.user_attrs.get("is_default")), best_folder=best.user_attrs.get("folder"),
                       best_host=best.user_attrs.get("host"))
        src = trial_folder(best, out)
        if src is None:
            summary["best_not_copied"] = f"its folder {best.user_attrs.get('folder')!r} is outside {out / 'trials'}"
        elif best.user_attrs.get("host") == host and src.is_dir():
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
    optuna = _optuna()
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if "diverged" not in t.user_attrs]  # a diverged trial scores 0 but is never "best"
    return max(done, key=lambda t: t.value) if done else None


def load_study(storage: str | None, out: str | Path, study_name: str = "exhume-kkt"):
    """Open an existing study (read-only use)."""
    return open_study(storage, out, study_name)
