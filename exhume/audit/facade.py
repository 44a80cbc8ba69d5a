"""``exhume.audit(model, train=(x, y), unseen=x_unseen, ...)``: a user's module and arrays in, a verdict out.

A facade (docs/DESIGN.md, "The rooms above and below"): it wraps the model in the documented conventions
(:mod:`exhume.victim.wrap`), measures the attack's assumptions on the user's training data
(:mod:`exhume.evaluation.assumptions`) and the membership exposure from the weights, runs the
public :func:`exhume.attack` within what the budget leaves, and evaluates with
:func:`exhume.evaluation.run.evaluate` on the arrays (the unseen images are the pool and the
control), then writes the report. It has no attack logic of its own. ``max_seconds`` is the whole
audit's wall time (its :class:`~exhume.deadline.Deadline`): the judging after the attack is estimated before it and
kept aside, the attack gets the rest (:mod:`exhume.audit.budget`).

Nothing that changes the result is assumed: the loss, the weight decay and the input
normalisation must be stated, or the audit is refused with a message naming the missing one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from exhume.audit.config import LOSS_NAMES, AuditConfig, from_options  # noqa: F401
from exhume.deadline import Deadline
from exhume.errors import ConfigError, DataError
from exhume.files.runfolder import own_output


@dataclass
class AuditResult:
    """The verdict (``"leaks"``, ``"no evidence"``, ``"inconclusive"``), its reason, and every number."""

    verdict: str
    reason: str
    metrics: dict[str, Any]
    reconstruction: Any
    out: Path | None = None

    @property
    def report(self) -> Path | None:
        return None if self.out is None else self.out / "report.html"


def _tensor_images(x, what: str) -> torch.Tensor:
    from exhume.audit.loading import as_images

    return torch.from_numpy(as_images(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, what))


def _normalisation(normalize, input_shape) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(mean, std)`` broadcast to the images (``normalize`` as :meth:`AuditConfig.mean_std` gives it) and its description."""
    from exhume.victim.victim import broadcast_stat

    if isinstance(normalize, str) and normalize.strip().lower() == "none":
        return torch.zeros(input_shape), torch.ones(input_shape), "none (raw [0, 1] pixels)"
    if not isinstance(normalize, (tuple, list)) or len(normalize) != 2:
        raise ConfigError(f"normalize must be (mean, std) or 'none', got {normalize!r}")
    mean = broadcast_stat(normalize[0], input_shape, "the normalisation mean")
    std = broadcast_stat(normalize[1], input_shape, "the normalisation std")
    if not torch.all(std > 0):
        raise ConfigError("the normalisation std must be > 0 everywhere")
    return mean, std, "(x - mean) / std"


def _head(model: nn.Module, sample: torch.Tensor, task: str | None, loss: str) -> tuple[str, str, int]:
    """(task, head, outputs) from the model's output on ``sample``; refuses a task that contradicts it."""
    try:
        with torch.no_grad():
            out = model.eval()(sample)
    except Exception as e:
        raise DataError(f"the model failed on a batch of the training images, shape {tuple(sample.shape)} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); its forward must take images (N, C, H, W), e.g. "
                        "start with nn.Flatten() for an MLP") from None
    if not isinstance(out, torch.Tensor) or out.shape[0] != sample.shape[0]:
        raise DataError(f"the model returned {type(out).__name__} {tuple(getattr(out, 'shape', ()))} for {sample.shape[0]} images; "
                        "expected a tensor of logits (N,), (N, 1) or (N, K)")
    k = int(out[0].numel())
    inferred = "binary" if k <= 2 else "multiclass"
    if task is not None and task != inferred:
        raise ConfigError(f"task {task!r} does not fit a model with {k} output(s): "
                          + ("a binary model has 1 or 2 logits" if task == "binary" else "a multiclass model has K > 2 logits"))
    if k == 2 and loss != "cross-entropy":
        raise ConfigError("a model with two logits is audited as a binary cross-entropy model (margin = logit[pos] - logit[neg]); "
                          f"loss {loss!r} over two logits is not supported: state loss 'cross-entropy'")
    if k == 1 and loss != "logistic":
        raise ConfigError(f"a model with one logit needs loss 'logistic' (BCE-with-logits), got {loss!r}")
    if k > 2 and loss != "cross-entropy":
        raise ConfigError(f"a model with {k} logits needs loss 'cross-entropy', got {loss!r}")
    return inferred, {1: "logit", 2: "two-logit"}.get(k, "logits"), k


def _labels(y, task: str, k: int, positive_class) -> tuple[torch.Tensor, Any]:
    """Labels in exhume's convention (binary ±1, multiclass ids) and the positive class used."""
    y = np.asarray(y).reshape(-1).astype(np.int64)
    values = sorted(set(y.tolist()))
    if task == "multiclass":
        if values[0] < 0 or values[-1] >= k:
            raise DataError(f"training labels range over {values[0]}..{values[-1]}; a model with {k} logits needs class ids 0..{k - 1}")
        return torch.from_numpy(y), None
    if len(values) > 2:
        raise DataError(f"training labels take {len(values)} values {values[:6]}; a binary model needs two")
    if k == 2 and not set(values) <= {0, 1}:
        raise DataError(f"training labels {values}: a two-logit model needs class ids 0 and 1 (the logit indices)")
    pos = max(values) if positive_class is None and k == 1 else (1 if positive_class is None else int(positive_class))
    if k == 2 and pos not in (0, 1):
        raise ConfigError(f"positive class {pos}: a two-logit model's positive class is 0 or 1")
    if positive_class is not None and pos not in values:
        raise ConfigError(f"positive class {pos} is not among the training labels {values}; expected one of them")
    return torch.from_numpy(np.where(y == pos, 1.0, -1.0).astype(np.float32)), pos


def _check_matching_size(n: int, method: str, attack_args: dict[str, Any]) -> None:
    """Refuse, before anything runs, a training set the evaluation's one-to-one matching would refuse after the attack.

    The evaluation pairs every training image with every candidate (``LIMITS.one_to_one_entries``);
    one run of the attack makes :meth:`~exhume.attacks.engine.base.Attack.candidate_count` candidates (a
    portfolio at least that many).
    """
    from exhume.attacks import attack_class
    from exhume.files import limits

    cls = attack_class(method)
    try:
        m = cls.of_settings(attack_args).candidate_count(n)
    except ConfigError:  # a malformed setting: the attack's own validation names it when it runs
        return
    cap = limits.LIMITS.one_to_one_entries
    if m is not None and n * m > cap:
        raise DataError(f"{n} training images: the evaluation matches every training image with every candidate, and the {method} "
                        f"attack makes at least {m} candidates ({n * m:,} pairs), over the limit of {cap:,} pairs "
                        f"(LIMITS.one_to_one_entries); with {m / n:g} candidates per image at most {int((cap / (m / n)) ** 0.5):,} "
                        "training images can be audited")


def audit(model: nn.Module, train, unseen, *, config: AuditConfig | None = None, progress: bool = True,
          settings: dict[str, Any] | None = None, force: bool = False, resume: bool = False, deadline: Deadline | None = None,
          **options: Any) -> AuditResult:
    """Audit ``model`` (trained on ``train = (x, y)``) for training-data leakage; see the module docstring.

    ``x``: display-space images (floats in [0, 1] or uint8), ``(N, C, H, W)``, ``(N, H, W)`` or
    ``(N, H, W, C)``; ``unseen``: images of the same kind the model never saw (pool and control).
    The settings (:class:`~exhume.audit.config.AuditConfig`, the same as ``exhume audit``'s) come as
    ``config`` and/or keywords: ``loss``: ``"logistic"`` (BCE-with-logits, one logit) or
    ``"cross-entropy"`` (two or more logits); ``weight_decay``: the L2 coefficient ``w`` of
    ``mean loss + (w/2)‖θ‖²``, i.e. the ``weight_decay`` of ``torch.optim.SGD``/``Adam`` (0 for
    none); ``normalize``: ``(mean, std)`` (scalars, per channel, or images) the model's inputs were
    normalised with, or ``"none"``; ``max_seconds``: the whole audit's wall time from this call on, the judging
    included (:mod:`exhume.audit.budget`; a budget too small for the fixed work: the attack keeps half of it, and
    one warning line on stderr says how long the audit takes); and ``task``, ``positive_class``, ``method``,
    ``attack_args``, ``alpha``, ``out``, ``seed``, ``device``; for the known-start threat model,
    ``start`` (the starting weights: a file or a dict of tensors), ``start_partial``, ``training``
    (a dict of training settings) and ``optimizer_state`` (Adam's final state, a file): the attack
    and the assumption check then use the known-start equation; ``dp_epsilon``, ``dp_delta``: the DP-SGD
    budget it was trained with (:mod:`exhume.audit.dp`, ``metrics["dp"]``). ``settings``: recorded as given.
    ``force=True`` replaces an earlier audit's attack run in ``out``; ``resume=True`` continues an
    interrupted one (same model, data and settings) and judges it. ``deadline``: the audit's, made by its caller from
    ``max_seconds`` (``exhume audit``: counted from its process's start; its seconds are then the budget), else
    ``max_seconds`` from this call.
    """
    origin = "the call of exhume.audit" if deadline is None else "its caller's deadline (exhume audit: the process's start)"
    cfg = from_options(config, **options)
    deadline = Deadline.after(cfg.max_seconds) if deadline is None else deadline  # checks, membership, attack, judging
    request, attack_args = _request(cfg, force, resume)
    with own_output(cfg.out) if cfg.out is not None else contextlib.nullcontext():  # one lock: attack, evaluation, report
        data = _audited(model, train, unseen, cfg, request.threat)
        _before_attack(data, cfg, request, deadline, origin)
        data.budget.announce(progress)
        began = time.perf_counter()
        recon = _attack(data, cfg, request, attack_args, progress)
        data.attack_seconds = time.perf_counter() - began
        return _judge(data, recon, cfg, settings, deadline)


@dataclass
class _Audited:
    """The user's model wrapped in exhume's conventions, its data, and what was measured before the attack."""

    user: nn.Module
    wrapped: nn.Module
    view: Any
    x: torch.Tensor
    centred: torch.Tensor
    y: torch.Tensor
    unseen: torch.Tensor
    loss: str
    info: dict[str, Any]
    failures: list[str]
    measured: dict[str, Any]
    equation: Any
    unseen_y: torch.Tensor | None = None  # the unseen images' labels in exhume's convention, when given
    mean: torch.Tensor | None = None  # the normalisation's mean: the model takes x - mean
    membership: tuple | None = None  # (exposure record, per-record scores): measured before the attack
    budget: Any = None  # the audit's budget split (exhume.audit.budget.AuditBudget)
    attack_seconds: float | None = None
    roc: bytes | None = None  # the membership ROC figure, drawn before the attack (PNG)
    judging_parts: dict[str, float] = field(default_factory=dict)  # seconds measured after the attack, by part


def _request(cfg: AuditConfig, force: bool, resume: bool):
    """The audit's :class:`~exhume.request.Request` for its attack (the known start, the time budget, the output), and
    the attack's own parameters apart (``attack_args`` may also set a budget: ``restarts``, ``iterations``)."""
    from exhume.attacks import attack_class
    from exhume.request import Request

    settings = {**attack_class(cfg.method).by_deadline(), **cfg.attack_args}
    return Request.of(None, {**settings, "device": cfg.device, "out": None if cfg.out is None else Path(cfg.out), "force": force,
                             "resume": resume, "start": cfg.start, "training": cfg.training or None,
                             "start_partial": cfg.start_partial, "optimizer_state": cfg.optimizer_state})


def _audited(model: nn.Module, train, unseen, cfg: AuditConfig, threat) -> _Audited:
    """Check the arrays, wrap the model (:mod:`exhume.victim.wrap`), and measure the attack's assumptions on the training data."""
    from exhume.evaluation.assumptions import checks_for, equation_of
    from exhume.request import view_of
    from exhume.victim import AttackerView
    from exhume.victim.wrap import Audited

    if not isinstance(train, (tuple, list)) or len(train) != 2:
        raise ConfigError("train must be (x, y): the training images and their labels")
    x = _tensor_images(train[0], "training images")
    unseen_x = _tensor_images(unseen[0] if isinstance(unseen, (tuple, list)) else unseen, "unseen images")
    unseen_labels = unseen[1] if isinstance(unseen, (tuple, list)) and len(unseen) > 1 else None
    if len(train[1]) != len(x):
        raise DataError(f"{len(x)} training images but {len(train[1])} labels")
    _check_matching_size(len(x), cfg.method, cfg.attack_args)
    if tuple(unseen_x.shape[1:]) != tuple(x.shape[1:]):
        raise DataError(f"unseen images have shape {tuple(unseen_x.shape[1:])}, training images {tuple(x.shape[1:])}; expected the same")
    input_shape = tuple(x.shape[1:])
    mean, std, norm_text = _normalisation(cfg.mean_std(), input_shape)
    user = model.float().eval()
    task, head, k = _head(user, ((x[:2] - mean) / std), cfg.task, cfg.loss)
    y, pos = _labels(train[1], task, k, cfg.positive_class)
    wrapped = Audited(user, std, head, positive=1 if pos is None or head != "two-logit" else pos).eval()
    loss = "logistic" if head == "two-logit" else cfg.loss  # cross-entropy over two logits is the logistic loss of their difference
    centred = x - mean
    view = AttackerView(model=wrapped, task=task, input_shape=input_shape, mean=mean, loss=loss,
                        weight_decay=cfg.weight_decay, num_classes=k if task == "multiclass" else None, n_train_hint=len(x))
    view = view_of(view, threat)  # the known start, attached once: the assumption check and the attack share this view
    equation = equation_of(cfg.method, view, cfg.attack_args)  # a known start changes the equation, and so its check
    checks = checks_for(equation)  # evaluator side: they read the training images
    failures = checks.layer_failures(wrapped, centred[:2])
    measured = checks.residual(wrapped, centred, y, loss, cfg.weight_decay)
    failures += checks.residual_failures(measured)
    info = {"model": type(user).__name__, "task": task, "outputs": k, "positive_class": pos, "loss": loss,
            "weight_decay": cfg.weight_decay, "normalisation": norm_text, "n_train": len(x), "n_unseen": len(unseen_x),
            "threat_model": view.threat_model}
    unseen_y = None if unseen_labels is None else _unseen_labels(unseen_labels, len(unseen_x), task, k, pos)
    return _Audited(user, wrapped, view, x, centred, y, unseen_x, loss, info, failures, measured, equation, unseen_y, mean)


def _unseen_labels(labels, count: int, task: str, k: int, pos) -> torch.Tensor:
    """The unseen images' labels in exhume's convention (binary ±1 with the training labels' positive class)."""
    y = np.asarray(labels).reshape(-1).astype(np.int64)
    if len(y) != count:
        raise DataError(f"{count} unseen images but {len(y)} labels")
    if task == "multiclass":
        return torch.from_numpy(y)
    return torch.from_numpy(np.where(y == pos, 1.0, -1.0).astype(np.float32))


def _start_record(view, cfg: AuditConfig) -> dict[str, Any]:
    """What metrics.json's ``audit`` records of the known start (nothing without one)."""
    if view.start is None:
        return {}
    from exhume.victim.start import start_digest

    given = str(cfg.start) if isinstance(cfg.start, (str, Path)) else f"given in Python ({len(view.start)} tensors)"
    return {"start": given, "start_digest": start_digest(view.start), "start_partial": cfg.start_partial,
            "training": None if view.training is None else view.training.record()}


def _law(data: _Audited, cfg: AuditConfig) -> dict[str, Any]:
    """Where the model sits against the law of data reconstruction, and the measured curve's reading there
    (:mod:`exhume.audit.law`)."""
    from exhume.audit.law import law_record, measured_reading
    from exhume.victim.law import family_of

    record = law_record(data.wrapped, data.view.start, data.view.input_shape, len(data.x))
    family = family_of(data.wrapped, data.view.start)
    record["measured"] = measured_reading(record, family, data.view.start is not None, cfg.method, dict(cfg.attack_args),
                                          task=data.view.task)
    return record


def _before_attack(data: _Audited, cfg: AuditConfig, request, deadline: Deadline, origin: str) -> None:
    """What does not depend on the attack, measured now: the membership exposure (timed), then the judging's estimate
    and the split of ``deadline``'s seconds (:mod:`exhume.audit.budget`), kept in ``data``."""
    from exhume.audit.budget import AuditBudget
    from exhume.evaluation.cost import judging_estimate
    from exhume.portfolio.plan import default_workers

    before, started = deadline.spent(), time.perf_counter()
    data.membership, records = _membership(data, cfg)
    probes = time.perf_counter()
    expected = _candidates(len(data.x), cfg, deadline.seconds, request.budget.restarts, request.budget.workers or default_workers())
    parameters = sum(p.numel() for p in data.wrapped.parameters())
    estimate, data.roc = judging_estimate(len(data.x), data.unseen, parameters, expected, (probes - started, records),
                                          None if cfg.out is None else data.membership[1])
    parts = {"start-up, loading and checks": before, "membership exposure": probes - started,
             "judging's probes": time.perf_counter() - probes}
    data.budget = AuditBudget.split(deadline.seconds, deadline.spent(), estimate, origin, parts)


def _candidates(n: int, cfg: AuditConfig, seconds: float, restarts, workers: int) -> int:
    """At most the candidates the attack returns: one run's count (``n`` when not fixed) times its restarts (the number
    asked, else the most the portfolio's sizing gives the whole budget: a wave of ``workers`` per ``seconds_per_restart``)."""
    from exhume.attacks import attack_class
    from exhume.portfolio.variants import MAX_AUTO_RESTARTS, SECONDS_PER_RESTART, restart_plan

    try:
        per = attack_class(cfg.method).of_settings(cfg.attack_args).candidate_count(n) or n
    except ConfigError:  # a malformed setting: the attack's own validation names it when it runs
        per = n
    if not isinstance(restarts, int):
        waves = max(1, round(seconds / (restart_plan(cfg.method).seconds_per_restart or SECONDS_PER_RESTART)))
        restarts = min(workers * waves, MAX_AUTO_RESTARTS)
    return per * restarts


def _attack(data: _Audited, cfg: AuditConfig, request, attack_args: dict[str, Any], progress: bool):
    """The public :func:`exhume.attack` on the attacker's view (its start attached already), by the audit's deadline for
    its attack (:meth:`~exhume.audit.budget.AuditBudget.attack_deadline`; ``attack_args``' own ``max_seconds``, if set)."""
    import exhume  # the public exhume.attack: whatever runs it (e.g. a restart portfolio) applies here

    deadline = None if request.budget.max_seconds is not None else data.budget.attack_deadline()
    return exhume.attack(data.view, method=cfg.method, seed=cfg.seed, request=request.on_view(), progress=progress,
                         deadline=deadline, **attack_args)


def _judge(data: _Audited, recon, cfg: AuditConfig, settings: dict[str, Any] | None, deadline: Deadline) -> AuditResult:
    """Evaluate the reconstruction against the training images (the unseen ones are pool and control), with the verdict."""
    from exhume.evaluation.assumptions import checks_for
    from exhume.evaluation.run import evaluate, margins_of
    from exhume.report import write_report

    judging = time.perf_counter()
    out = None if cfg.out is None else Path(cfg.out)
    margins, support_margins = margins_of(data.wrapped, data.centred, data.y, data.info["task"], data.loss)
    checks = checks_for(data.equation)
    failures = data.failures + checks.fit_failures(margins, cfg.weight_decay) + checks.run_failures(recon, margins, cfg.weight_decay)
    owner = time.perf_counter()
    findings, scores = _owner_findings(data, recon, cfg)
    data.judging_parts["identifiability"] = time.perf_counter() - owner
    result = evaluate(recon, train=(data.x, None), unseen=data.unseen, margins=margins, support_margins=support_margins,
                      assumptions=failures, alpha=cfg.alpha, out=None if out is None else out / "evaluation",
                      threat_model=data.view.threat_model, owner_findings=findings)
    m = result.metrics
    m["victim"] = {**data.info, "stationarity_residual": data.measured["value"], "stationarity_definition": data.measured["definition"],
                   "stationarity_limit": data.measured["limit"],
                   "train_accuracy": float((torch.as_tensor(margins) > 0).double().mean())}
    m["audit"] = {**(settings or {}), "method": cfg.method, "max_seconds": deadline.seconds, "seed": cfg.seed,
                  "wall_seconds": None, **_start_record(data.view, cfg)}
    m["law"] = _law(data, cfg)
    if cfg.dp_epsilon is not None:  # the informed adversary on the owner's model and data, beside the bound
        from exhume.audit.dp import dp_record

        informed = time.perf_counter()
        m["dp"] = dp_record(cfg, data, recon, m)
        data.judging_parts["informed adversary (DP)"] = time.perf_counter() - informed
    if out is not None:
        _write_scores(scores, out / "evaluation", data.roc)
    _timed(m, data, deadline, judging)
    if out is not None:
        result.save(out / "evaluation")
        write_report(out)
        _timed(m, data, deadline, judging)  # the report written: the seconds returned (metrics.json's are those before the report)
    return AuditResult(verdict=m["verdict"], reason=m["verdict_reason"], metrics=m, reconstruction=recon, out=out)


def _timed(m: dict[str, Any], data: _Audited, deadline: Deadline, judging: float) -> None:
    """The audit's seconds so far into ``m["audit"]``: the wall time and the budget's split with its measured parts."""
    now, wall = time.perf_counter(), deadline.spent()
    m["audit"]["wall_seconds"] = round(wall, 1)
    if data.budget is not None:  # None: judged without the audit's split (a caller of _judge alone)
        parts = {**data.judging_parts, "evaluation's matching": m.get("evaluation_seconds") or 0.0}
        parts["figures, files and the rest"] = now - judging - sum(parts.values())
        m["audit"]["budget"] = data.budget.record(data.attack_seconds, now - judging, wall, parts)


#: at most this many unseen images are scored for membership (or as many as the training images, if more)
MEMBERSHIP_NONMEMBERS = 1000


def _owner_findings(data: _Audited, recon, cfg: AuditConfig) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What only the owner can measure (EVALUATOR-SIDE: it reads the training images): the equation's identifiability
    (:mod:`exhume.evaluation.identifiability`), the membership exposure from the weights
    (:mod:`exhume.evaluation.weights_membership`) on the training images and up to ``MEMBERSHIP_NONMEMBERS`` unseen ones,
    and each layer's spectrum (with the start known, also that of what training added), near-zero pre-activations and
    inputs' distance to its row space (:mod:`exhume.evaluation.layers`)."""
    from exhume.evaluation.identifiability import identifiability
    from exhume.evaluation.layers import layer_diagnostics

    ident = identifiability(data.equation, data.wrapped, data.centred, data.y, data.loss, data.measured, recon)
    exposure, scores = data.membership if data.membership is not None else _membership(data, cfg)[0]
    view, n = data.view, len(data.x)  # where the weights (and, the start known, what training added) show the span
    decay = view.training.decay(n) if view.start is not None and view.training is not None else None
    layers = layer_diagnostics(data.wrapped, data.centred, n, start=view.start, decay=decay)
    return {"identifiability": ident, "membership_exposure": exposure, "layers": layers}, scores


def _membership(data: _Audited, cfg: AuditConfig) -> tuple[tuple[dict[str, Any], dict[str, np.ndarray]], int]:
    """The membership exposure from the weights (it does not depend on the attack) and the records it scored."""
    from exhume.evaluation.weights_membership import membership_exposure

    count = min(len(data.unseen), max(len(data.x), MEMBERSHIP_NONMEMBERS))
    pick = torch.from_numpy(np.sort(np.random.default_rng(cfg.seed).permutation(len(data.unseen))[:count]))
    labels = None if data.unseen_y is None else data.unseen_y[pick]
    got = membership_exposure(data.view, data.centred, data.y, data.unseen[pick] - data.mean, labels, seed=cfg.seed)
    return got, len(data.x) + count


def _write_scores(scores: dict[str, np.ndarray], folder: Path, roc: bytes | None = None) -> None:
    """The per-record membership scores (``membership_scores.npz``) and their ROC (``membership_roc.png``; ``roc``: drawn already)."""
    import io

    from exhume.evaluation.weights_membership import plot_roc
    from exhume.files.jsonio import atomic_write

    buffer = io.BytesIO()
    np.savez(buffer, **scores)
    atomic_write(folder / "membership_scores.npz", buffer.getvalue())
    if roc is None:
        plot_roc(scores, folder / "membership_roc.png")
    else:
        atomic_write(folder / "membership_roc.png", roc)
