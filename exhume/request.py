"""What a caller asks of a run: the threat model, the budget and the output, three small frozen types.

:func:`exhume.attack`, :func:`exhume.portfolio.run_portfolio`, :func:`exhume.tune.tune` and the
audit take one :class:`Request`, or the same settings as flat keywords (``max_seconds=60``,
``start=...``, ``out=...``) that :meth:`Request.of` sorts into it, leaving the attack's own
parameters apart. Every field is checked when the request is made: a bad one is one line naming
it and what was expected.

- :class:`ThreatModel`: what the attacker holds besides the weights: the victim's training loss and
  weight decay where its metadata lacks them, the weights training started from with the training
  settings the owner knows (:mod:`exhume.victim.start`).
- :class:`Budget`: seconds, iterations, restarts, workers, device, precision, batched restarts.
- :class:`Output`: the run folder, whether a run already there is replaced or resumed, how often it records itself.

:func:`view_of` is the one place a victim becomes the attacker's view and the one place a start
is attached to it; a run calls it once, and hands the view on with nothing left to attach.
:func:`deadline_of` makes the run's :class:`~exhume.deadline.Deadline` from the budget's seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from os import PathLike
from typing import Any

from exhume.choices import BATCH_CHOICES, DTYPE_NAMES
from exhume.deadline import Deadline
from exhume.errors import ConfigError
from exhume.files.fields import check_setting
from exhume.losses import check_loss
from exhume.params import parse_restarts


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


def _path(name: str, value: Any, what: str = "file") -> None:
    if value is not None and not isinstance(value, (str, PathLike)):
        raise ConfigError(f"{name} must be a {what} path, got {type(value).__name__}")


@dataclass(frozen=True)
class ThreatModel:
    """What the attacker holds besides the weights; ``ThreatModel()``: nothing to add (weights only, or the
    start an :class:`~exhume.victim.AttackerView` was built with).

    ``loss`` and ``weight_decay``: the victim's training loss and weight decay, facts the attacker knows, stated where
    the victim's metadata lacks them (a statement that contradicts the metadata is refused by :func:`view_of`).
    ``start``: the weights training started from (a dict of tensors by parameter name, or a
    ``.safetensors`` / state-dict file, never unpickled); ``training``: the settings the owner knows
    (a dict of :class:`~exhume.victim.start.TrainingSettings` fields, or one); ``start_partial``: the
    start covers some parameters only; ``optimizer_state``: Adam's final state (a file, read with the model).
    ``known_records``: training records the attacker knows, the informed adversary's; ``candidates``: k records
    of which one was trained on, the candidate game's (each an ``.npz`` of ``x`` and ``y`` or a pair ``(x, y)``,
    :mod:`exhume.victim.known`).
    """

    start: Any = None
    training: Any = None
    start_partial: bool = False
    optimizer_state: Any = None
    loss: str | None = None
    weight_decay: float | None = None
    known_records: Any = None
    candidates: Any = None

    def __post_init__(self) -> None:
        from exhume.victim.known import Records
        from exhume.victim.start import TrainingSettings, training_settings

        if self.loss is not None:
            check_loss(self.loss)
        object.__setattr__(self, "weight_decay", check_setting("weight_decay", self.weight_decay, low=0.0, optional=True))
        if self.start is not None and not isinstance(self.start, (str, PathLike, dict)):
            raise ConfigError(f"start must be a weights file or a dict of parameter names to tensors, got {type(self.start).__name__}")
        _flag("start_partial", self.start_partial)
        _path("optimizer_state", self.optimizer_state)
        if isinstance(self.training, dict):  # a copy, so that what was checked is what is used; {}: no settings known
            object.__setattr__(self, "training", dict(self.training) or None)
        if isinstance(self.start, dict):
            object.__setattr__(self, "start", dict(self.start))
        if self.start is None and (self.training is not None or self.optimizer_state is not None or self.start_partial):
            raise ConfigError("training, optimizer_state and start_partial describe training from a start: give the starting "
                              "weights too (start=...)")
        if self.optimizer_state is not None and isinstance(self.training, TrainingSettings):
            raise ConfigError("optimizer_state adds Adam's second moment to training settings given as a dict; with "
                              "TrainingSettings, set its second_moment instead")
        training_settings(self.training)  # unknown or out-of-range settings: one line
        for name in ("known_records", "candidates"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, PathLike, tuple, list, Records)):
                raise ConfigError(f"{name} must be an .npz file (x: images, y: labels) or a pair (x, y), got {type(value).__name__}")

    @property
    def known_start(self) -> bool:
        return self.start is not None

    @property
    def informed(self) -> bool:
        """The attacker holds training records or candidates (the informed adversary's threat models)."""
        return self.known_records is not None or self.candidates is not None

    @property
    def facts(self) -> dict[str, Any]:
        """The victim's facts stated here (``loss``, ``weight_decay``), those given."""
        return {k: v for k, v in (("loss", self.loss), ("weight_decay", self.weight_decay)) if v is not None}


@dataclass(frozen=True)
class Budget:
    """How much a run may spend: ``max_seconds`` (the wall seconds of the whole call or command from its start: a
    portfolio's, all its restarts together; :func:`deadline_of` makes its deadline), ``iterations`` (each run's
    steps: the attack's budget parameter, ``iterations`` or ``steps``), ``restarts`` (a number, ``"auto"`` or None:
    the method's default), ``workers`` (parallel restarts here; None: the cores, at most 8), ``device``, ``dtype``
    (None: the attack's) and ``batch_restarts`` (``"auto"``: one batched process on a CUDA device; ``"on"``;
    ``"off"``: worker processes)."""

    max_seconds: float | None = None
    iterations: int | None = None
    restarts: int | str | None = None
    workers: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    batch_restarts: str = "auto"

    def __post_init__(self) -> None:
        from exhume.device import check_device

        s = self.max_seconds
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not (s > 0 and math.isfinite(s))):
            raise ConfigError(f"max_seconds must be a positive number of seconds, got {s!r}")
        for name in ("iterations", "workers"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        object.__setattr__(self, "restarts", parse_restarts(self.restarts))
        if not isinstance(self.device, str):
            raise ConfigError(f"device must be a torch device name such as 'cpu' or 'cuda', got {self.device!r}")
        check_device(self.device)
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.batch_restarts not in BATCH_CHOICES:
            raise ConfigError(f"batch_restarts must be one of {', '.join(BATCH_CHOICES)}, got {self.batch_restarts!r}")

    def attack_settings(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` (the attack's own parameters) with what one run of ``method`` takes of this budget as settings:
        its step budget and ``dtype`` (its seconds are the run's deadline). A setting given both ways is refused."""
        from exhume.attacks import attack_class

        given = {attack_class(method).budget: self.iterations, "dtype": self.dtype}
        given = {k: v for k, v in given.items() if v is not None}
        twice = sorted(set(given) & set(params))
        if twice:
            raise ConfigError(f"{', '.join(twice)} given twice (as an attack parameter and in the budget); give it once")
        return {**params, **given}


@dataclass(frozen=True)
class Output:
    """Where a run is kept: ``folder`` (None: nowhere, the result is returned only), ``force`` (replace a run
    already there), ``resume`` (continue it from its last checkpoint, written for the same victim), and how often it
    records itself: ``checkpoint_every`` and ``log_every`` steps (None: the attack's own cadence)."""

    folder: Any = None
    force: bool = False
    resume: bool = False
    checkpoint_every: int | None = None
    log_every: int | None = None

    def __post_init__(self) -> None:
        _path("out", self.folder, "folder")
        _flag("force", self.force)
        _flag("resume", self.resume)
        for name in ("checkpoint_every", "log_every"):
            object.__setattr__(self, name, check_setting(name, getattr(self, name), integer=True, low=1, optional=True))

    @property
    def every(self) -> tuple[int | None, int | None]:
        """``(checkpoint_every, log_every)``, as :meth:`exhume.attacks.Attack.run` takes them."""
        return self.checkpoint_every, self.log_every


#: the flat keywords that :meth:`Request.of` sorts into a request: keyword -> (group, field)
KEYWORDS: dict[str, tuple[str, str]] = {
    **{f.name: ("threat", f.name) for f in fields(ThreatModel)},
    **{f.name: ("budget", f.name) for f in fields(Budget)},
    "out": ("output", "folder"), "force": ("output", "force"), "resume": ("output", "resume"),
    "checkpoint_every": ("output", "checkpoint_every"), "log_every": ("output", "log_every"),
}


@dataclass(frozen=True)
class Request:
    """What a caller asks of a run: the threat model, the budget and the output (each with its defaults)."""

    threat: ThreatModel = field(default_factory=ThreatModel)
    budget: Budget = field(default_factory=Budget)
    output: Output = field(default_factory=Output)

    def __post_init__(self) -> None:
        for name, kind in (("threat", ThreatModel), ("budget", Budget), ("output", Output)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"request {name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")

    @classmethod
    def of(cls, request: Request | None, settings: dict[str, Any]) -> tuple[Request, dict[str, Any]]:
        """``(request, the rest)``: the request's fields among ``settings`` (flat keywords such as ``max_seconds``,
        ``start``, ``out``; :data:`KEYWORDS`) made into a Request, the rest (the attack's parameters) apart.
        With ``request`` given, the flat keywords may not set its fields again."""
        ours = {k: v for k, v in settings.items() if k in KEYWORDS}
        rest = {k: v for k, v in settings.items() if k not in KEYWORDS}
        if request is not None:
            if not isinstance(request, Request):
                raise ConfigError(f"request must be an exhume.request.Request, got {type(request).__name__}")
            if ours:
                raise ConfigError(f"{', '.join(sorted(ours))}: set in request= already; give each setting once")
            return request, rest
        groups: dict[str, dict[str, Any]] = {"threat": {}, "budget": {}, "output": {}}
        for key, value in ours.items():
            group, name = KEYWORDS[key]
            groups[group][name] = value
        return cls(ThreatModel(**groups["threat"]), Budget(**groups["budget"]), Output(**groups["output"])), rest

    def on_view(self) -> Request:
        """This request once :func:`view_of` has attached its start and facts: nothing left to attach."""
        return replace(self, threat=ThreatModel())


def deadline_of(request: Request, deadline: Deadline | None = None) -> Deadline:
    """The run's deadline: ``deadline`` when a caller above gives one (its own, or a share of it), else the budget's
    ``max_seconds`` from now (never without); both at once is refused (one budget, one meaning)."""
    if deadline is None:
        return Deadline.after(request.budget.max_seconds)
    if not isinstance(deadline, Deadline):
        raise ConfigError(f"deadline must be an exhume.deadline.Deadline, got {type(deadline).__name__}")
    if request.budget.max_seconds is not None:
        raise ConfigError("max_seconds and deadline= both given: give the run's budget once")
    return deadline


def view_of(victim, threat: ThreatModel | None = None):
    """The attacker's view of ``victim`` (a Victim, or an AttackerView as it is) with ``threat``'s facts and start.

    The one place both happen: the weights, task, loss and input statistics of a Victim, never
    its training images; the loss and weight decay ``threat`` states where the metadata lacks them; the start checked
    against the model (a file read with safetensors or ``weights_only=True``), Adam's state read, the training
    settings made.
    """
    from exhume.victim import AttackerView, Victim
    from exhume.victim.start import check_start, load_start, training_settings, with_optimizer_state

    view = victim.attacker_view() if isinstance(victim, Victim) else victim
    if not isinstance(view, AttackerView):
        raise ConfigError(f"expected a Victim or an AttackerView, got {type(victim).__name__}")
    if threat is None:
        return view
    view = with_records(with_facts(view, threat.facts), threat)
    if not threat.known_start:
        return view
    partial = threat.start_partial
    start = (check_start(threat.start, view.model, "the start", partial) if isinstance(threat.start, dict)
             else load_start(threat.start, view.model, partial))
    training = threat.training
    if threat.optimizer_state is not None:
        training = with_optimizer_state(dict(training or {}), threat.optimizer_state, view.model)
    return replace(view, start=start, training=training_settings(training or None))


def with_facts(view, facts: dict[str, Any]):
    """``view`` with the victim's facts ``facts`` (loss, weight decay) its metadata lacks; one that contradicts the
    metadata is refused, naming both values."""
    for name, stated in facts.items():
        recorded = getattr(view, name)
        if recorded is not None and recorded != stated:
            raise ConfigError(f"{name} {stated!r} was stated, but the victim's metadata records {recorded!r}; "
                              f"leave {name} out (the metadata's is used) or correct the victim")
    missing = {k: v for k, v in facts.items() if getattr(view, k) is None}
    return replace(view, **missing) if missing else view


def with_records(view, threat: ThreatModel):
    """``view`` with the records ``threat`` says the attacker knows (known training records, the game's candidates)."""
    from exhume.victim.known import records_of

    if not threat.informed:
        return view
    shape, task = tuple(view.input_shape), view.task
    known = None if threat.known_records is None else records_of(threat.known_records, shape, task, "known_records")
    candidates = None if threat.candidates is None else records_of(threat.candidates, shape, task, "candidates")
    return replace(view, known=known if known is not None else view.known,
                   candidates=candidates if candidates is not None else view.candidates)
