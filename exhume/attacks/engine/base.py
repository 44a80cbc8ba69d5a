"""The attack protocol, validated keyword arguments, the registry, and the Reconstruction result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from exhume.attacks.engine.record import RunRecord, parse_record
from exhume.choices import DTYPE_NAMES
from exhume.equations.kinds import Equation, Stationarity
from exhume.equations.workcopy import attack_model  # noqa: F401  (re-exported: every attack takes it from here)
from exhume.errors import ConfigError, ExhumeError
from exhume.files.jsonio import write_json
from exhume.files.schemas import check_reconstruction_tensors, read_reconstruction_meta


@dataclass(frozen=True)
class Param:
    """One keyword argument of an attack: its type, default, allowed range and meaning.

    ``choices``: the values allowed (one of these names). ``words``: for a number (``kind`` int or
    float), names allowed instead of one, e.g. ``("auto",)`` for "auto or a number"; ``low`` and
    ``high`` bound the number, ``low_open``: ``low`` itself excluded (a number > ``low``).
    ``search``: the range a hyperparameter search (``exhume tune``) draws it from, as
    ``(low, high, "log")`` (log-uniform) or ``(low, high, "linear")``; None: not searched.
    """

    default: Any
    kind: type
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    allow_none: bool = False
    search: tuple[float, float, str] | None = None
    words: tuple[str, ...] = ()
    low_open: bool = False

    def validate(self, name: str, value: Any) -> Any:
        if value is None:
            if self.allow_none:
                return None
            raise ConfigError(f"{name} must not be None ({self.help})")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False, got {value!r}")
            return value
        if self.kind in (int, float) and self.words:
            if value in self.words:
                return value
            try:
                return self._number(name, value)
            except ConfigError:
                raise ConfigError(f"{name} must be {self.allowed()}, got {value!r}") from None
        if self.kind in (int, float):
            return self._number(name, value)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(str, self.choices))}; got {value!r}")
        if not isinstance(value, self.kind):
            raise ConfigError(f"{name} must be {self.kind.__name__}, got {value!r}")
        return value

    def _number(self, name: str, value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        if self.kind is int and float(value) != int(value):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        value = self.kind(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{name} must be finite, got {value!r}")
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise ConfigError(f"{name} must be {'>' if self.low_open else '>='} {self.low}, got {value!r} ({self.help})")
        if self.high is not None and value > self.high:
            raise ConfigError(f"{name} must be <= {self.high}, got {value!r} ({self.help})")
        return value

    def range_text(self) -> str:
        """The allowed values as ``--list-params`` shows them: ``off | auto``, ``[0.0, 1.0]``, ``>= 0.0``, ``auto | > 0.0``."""
        if self.choices is not None:
            return " | ".join(map(str, self.choices))
        low = None if self.low is None else f"{'(' if self.low_open else '['}{self.low}"
        if low is not None and self.high is not None:
            rng = f"{low}, {self.high}]"
        elif low is not None or self.high is not None:
            rng = f"{'>' if self.low_open else '>='} {self.low}" if low is not None else f"<= {self.high}"
        else:
            rng = self.kind.__name__ if self.kind is not object else "any"
        return " | ".join((*self.words, rng))

    def span(self) -> str:
        """The numbers allowed, in words: ``in [0, 0.5]``, ``> 0``, ``>= 1`` (empty when unbounded)."""
        low = None if self.low is None else f"{self.low:g}"
        if low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {self.high:g}]"
        if low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return "" if self.high is None else f"<= {self.high:g}"

    def allowed(self) -> str:
        """What a value may be, in words: ``'auto' or a number > 0``, ``one of off, auto``, ``an integer >= 1``."""
        if self.choices is not None:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.kind not in (int, float):
            return "any value" if self.kind is object else f"a {self.kind.__name__}"
        number = " ".join(("an integer" if self.kind is int else "a number", self.span())).strip()
        if not self.words:
            return number
        return f"{', '.join(map(repr, self.words))} or {number}"


#: a step budget that never binds: the run is bounded by its deadline alone (see :meth:`Attack.by_deadline`)
NO_STEP_LIMIT = 10_000_000

#: settings every attack once declared, and where each went: a run's bounds and cadence, and the victim's facts
MOVED = {
    "max_seconds": "a budget: pass it to exhume.attack (max_seconds=, a Budget's) / --max-seconds, or a Deadline to Attack.run",
    "checkpoint_every": "how often a run records itself: pass it to Attack.run / exhume.attack (an Output's) / --checkpoint-every",
    "log_every": "how often a run records itself: pass it to Attack.run / exhume.attack (an Output's) / --log-every",
    "weight_decay": "a fact about the victim: its metadata, or state it in the threat model (ThreatModel(weight_decay=), "
                    "exhume.attack(weight_decay=)) / --weight-decay",
    "loss": "a fact about the victim: its metadata, or state it in the threat model (ThreatModel(loss=), exhume.attack(loss=)) "
            "/ --loss",
}
#: the victim's facts an attack reads from the attacker's view (once settings: :data:`MOVED`)
VIEW_FACTS = ("weight_decay", "loss")


@dataclass(frozen=True)
class RestartPlan:
    """How a restart portfolio (:mod:`exhume.portfolio`) spends a budget on one attack.

    ``variants``: parameter overrides, restart ``k`` takes ``variants[k % len]`` (restart 0 is the
    caller's own settings, so the first is usually ``{}``). ``seconds_per_restart`` and
    ``min_iterations``: what one restart should get before a further restart pays more than a
    longer run (None: the portfolio's defaults, measured on kkt).
    """

    variants: tuple[dict[str, Any], ...] = ({},)
    seconds_per_restart: float | None = None
    min_iterations: int | None = None


class Attack:
    """Base class: subclasses declare ``name`` and ``params`` and implement :meth:`run`.

    ``Attack(**kwargs)`` validates every keyword against ``params``; unknown names are refused.

    **The protocol**, what the rooms above read from an attack (none of them names one):

    - ``equation``: what it inverts, a description (:mod:`exhume.equations.kinds`; ``Equation()`` when it
      inverts none) whose type decides which assumptions the evaluation checks on the real training data
      (:mod:`exhume.evaluation.assumptions`);
    - ``restart_plan``: a :class:`RestartPlan` when ``exhume.attack`` should spend its budget on a
      portfolio of restarts by default (None: one run unless restarts are asked for);
    - ``budget``: the parameter that counts its steps; :meth:`by_deadline` bounds a run by its deadline alone;
      ``checkpoint_every`` and ``log_every``: how often a run records itself unless :meth:`run` is told;
    - ``multipliers``: its ``Reconstruction.scores`` are the multipliers λ of its equation, and
      ``run(callback_multipliers=True)`` passes them (and the labels) to the callback, as the
      attacker-side score (:mod:`exhume.attacks.engine.score`) needs;
    - :meth:`search_space` (from ``Param.search``) and :meth:`search_start`, for ``exhume tune``;
    - :meth:`candidate_count`: how many candidates one run makes for ``n`` training points;
    - ``uses_start``: it uses the starting weights when the view has them (the known-start threat
      model), and :meth:`equation_on` names the equation it then inverts;
    - ``presets``: named settings, ``Attack(preset=NAME, **overrides)`` (``exhume attack --preset NAME``), the
      preset's settings then the caller's, the name recorded in the config;
    - ``batchable``: its restarts can run as one batched problem (``exhume.portfolio.batched``: it
      provides ``problem``, ``unknowns`` and ``open_state``).
    """

    name: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    #: named settings: ``Attack(preset=NAME, **overrides)`` takes the preset's settings, then the caller's
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    #: settings the attack no longer has, with the values under which a run did what it does now: a checkpoint that
    #: recorded one resumes (:func:`exhume.attacks.engine.checkpoint.load_checkpoint`)
    retired: ClassVar[dict[str, tuple[Any, ...]]] = {}
    takes_init: ClassVar[bool] = True  # run() accepts starting candidates (init=, init_name=)
    equation: ClassVar[Equation] = Stationarity()  # an attack that declares none is judged on every check
    restart_plan: ClassVar[RestartPlan | None] = None
    budget: ClassVar[str] = "iterations"
    checkpoint_every: ClassVar[int] = 1000  # steps between checkpoints (with an output folder), unless run() is told
    log_every: ClassVar[int] = 100  # steps between loss-history entries, unless run() is told
    multipliers: ClassVar[bool] = False
    uses_start: ClassVar[bool] = False  # a start in the view changes what it solves (exhume.attack refuses one otherwise)
    batchable: ClassVar[bool] = False  # the portfolio may run its restarts as one batched problem

    def __init__(self, preset: str | None = None, **kwargs: Any) -> None:
        kwargs = self.with_preset(preset, kwargs)
        unknown = sorted(set(kwargs) - set(self.params))
        moved = [f"{k} is {MOVED[k]}" for k in unknown if k in MOVED]
        if moved:
            raise ConfigError(f"attack {self.name!r}: {'; '.join(moved)}")
        if unknown:
            gone = [k for k in unknown if k in self.retired]
            hint = f" ({', '.join(gone)}: removed, every run now does what the old default did; leave it out)" if gone else ""
            raise ConfigError(
                f"attack {self.name!r} has no parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(self.params))}{hint}"
            )
        self.config = {k: p.validate(k, kwargs.get(k, p.default)) for k, p in self.params.items()}
        if preset is not None:
            self.config["preset"] = preset  # recorded; its settings are in the config already
        self.given = frozenset(kwargs)  # the settings the caller chose, a preset's included

    @classmethod
    def with_preset(cls, preset: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` on top of the settings of ``preset`` (None: ``kwargs`` alone); an unknown preset is one line."""
        if preset is None:
            return dict(kwargs)
        if preset not in cls.presets:
            known = ", ".join(sorted(cls.presets)) or "none"
            raise ConfigError(f"attack {cls.name!r} has no preset {preset!r}; known: {known}")
        return {**cls.presets[preset], **kwargs}

    def __getattr__(self, key: str) -> Any:
        config = self.__dict__.get("config", {})
        if key in config:
            return config[key]
        raise AttributeError(key)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

    def check(self, view) -> None:
        """Refuse (with a :class:`~exhume.errors.ConfigError`) a victim this attack cannot handle.

        Called by :meth:`run` and by callers (``exhume.attack``, ``exhume tune``) before the first
        step, so that a task or input shape the attack does not support fails at once with one line.
        The default accepts every victim.
        """

    def run(self, view, **kwargs) -> Reconstruction:  # pragma: no cover - abstract
        """One run on ``view``; the keywords every attack takes: ``out``, ``seed``, ``device``, ``resume``, ``progress``,
        ``callback``, ``deadline`` (a :class:`~exhume.deadline.Deadline`, default never), ``checkpoint_every`` and
        ``log_every`` (None: the class's), ``owner`` (a :class:`~exhume.attacks.engine.checkpoint.RunOwner` for its checkpoints)."""
        raise NotImplementedError

    def cadence(self, checkpoint_every: int | None, log_every: int | None) -> tuple[int, int]:
        """``(checkpoint_every, log_every)`` of a run: as given (positive integers), else this attack's own."""
        from exhume.files.fields import check_setting

        return (check_setting("checkpoint_every", checkpoint_every, integer=True, low=1, optional=True) or self.checkpoint_every,
                check_setting("log_every", log_every, integer=True, low=1, optional=True) or self.log_every)

    def retired_on(self, view) -> dict[str, tuple[Any, ...]]:
        """:attr:`retired`, and the facts every attack now reads from ``view`` (:data:`VIEW_FACTS`) at None (left to the
        metadata) or the view's value: a checkpoint that stated what the view now says resumes."""
        return {**self.retired, **{k: (*self.retired.get(k, (None,)), getattr(view, k)) for k in VIEW_FACTS}}

    #: settings that change the peak memory, for the advice of a refusal (:mod:`exhume.attacks.engine.memory`):
    #: ``"count"`` (an integer: the largest that fits is named), ``"dtype"``, or a tuple of choices
    memory_knobs: ClassVar[dict[str, Any]] = {}

    def peak_memory_bytes(self, view) -> int | None:
        """The bytes this attack adds to the process at its peak on ``view``, from shapes, counts and
        dtype alone (nothing is allocated). The default is a rough bound for attacks that give none:
        :func:`exhume.attacks.engine.memory.generic_peak`. ``exhume.attack`` refuses a run above what is available."""
        from exhume.attacks.engine.memory import generic_peak

        return generic_peak(self, view)

    def unbatched_on(self, view) -> str | None:
        """Why this attack's restarts on ``view`` cannot share one batched problem (None: they can, where the class is
        :attr:`batchable`; :mod:`exhume.portfolio.batched`)."""
        return None

    def effective(self, view, name: str) -> Any:
        """The value setting ``name`` takes on ``view`` (a count left at None resolved as the run would)."""
        return self.config.get(name)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every setting's default: what a checkpoint written before a setting existed is resumed with."""
        return {name: p.default for name, p in cls.params.items()}

    @classmethod
    def search_space(cls) -> dict[str, tuple[float, float, bool]]:
        """``name: (low, high, log)`` for each parameter that declares a search range (``Param.search``)."""
        return {name: (p.search[0], p.search[1], p.search[2] == "log") for name, p in cls.params.items() if p.search}

    def search_start(self, view) -> dict[str, float]:
        """The first trial of a search on ``view``: this attack's own values of the searched parameters.

        An attack whose default of a searched parameter is not a number (e.g. ``"auto"``) resolves it here.
        """
        return {name: self.config[name] for name in self.search_space()}

    @classmethod
    def of_settings(cls, settings: dict[str, Any] | None) -> Attack:
        """This attack with its own parameters among ``settings`` (others, e.g. a portfolio's ``restarts``, are
        :func:`exhume.attack`'s), validated."""
        return cls(**{k: v for k, v in (settings or {}).items() if k in cls.params})

    def equation_on(self, view) -> Equation:
        """The equation a run on ``view`` inverts (the class's :attr:`equation` unless the view changes it, e.g. a known start)."""
        return self.equation

    def candidate_count(self, n: int) -> int | None:
        """How many candidates one run makes when the training set has ``n`` points (None: not fixed by ``n``)."""
        return None

    @classmethod
    def by_deadline(cls) -> dict[str, Any]:
        """The keyword arguments of a run that its deadline alone bounds: a step budget that never binds."""
        return {cls.budget: NO_STEP_LIMIT}


#: the attack exhume runs when none is named (exhume.attack, the portfolio, tune, the audit, the command line)
DEFAULT_METHOD = "kkt"


DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def initial_candidates(init: torch.Tensor | None, m: int | None, input_shape: tuple[int, ...], mean: torch.Tensor,
                       init_scale: float, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Starting candidates in centred space: ``N(0,1)·init_scale`` noise, or the given ``init``.

    ``init`` holds display-space images ``(m, *input_shape)`` chosen by the caller (the
    initialisation study passes training, partition or mixed images: evaluator tools, labelled
    oracle in the result; an attack never builds them itself).
    """
    if init is None:
        if m is None:
            raise ConfigError("the number of candidates m is unknown")
        return torch.randn(m, *input_shape, generator=generator, dtype=dtype) * init_scale
    init = torch.as_tensor(init)
    if tuple(init.shape[1:]) != tuple(input_shape):
        raise ConfigError(f"init images have shape {tuple(init.shape[1:])}, the victim's input shape is {tuple(input_shape)}")
    if m is not None and init.shape[0] != m:
        raise ConfigError(f"init holds {init.shape[0]} images but m={m} candidates were asked for")
    if not torch.isfinite(init).all():
        raise ConfigError("init images contain NaN or inf")
    return init.to(dtype) - mean.to(dtype)


ATTACKS: dict[str, type[Attack]] = {}


def register(cls: type[Attack]) -> type[Attack]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name to be registered")
    ATTACKS[cls.name] = cls
    return cls


def attack_class(name: str) -> type[Attack]:
    """The registered attack ``name`` (its class: its protocol, without validating any setting)."""
    if name not in ATTACKS:
        raise ConfigError(f"unknown attack method {name!r}; known: {', '.join(sorted(ATTACKS))}")
    return ATTACKS[name]


def check_uses_start(name: str) -> None:
    """Refuse a start for the attack ``name`` if it would ignore it (its result would claim a threat model it did not use)."""
    if not attack_class(name).uses_start:
        known = ", ".join(sorted(k for k, cls in ATTACKS.items() if cls.uses_start))
        raise ConfigError(f"the {name!r} attack does not use the starting weights; attacks that do: {known}")


def get_attack(name: str, **kwargs: Any) -> Attack:
    return attack_class(name)(**kwargs)


@dataclass
class Reconstruction:
    """What an attack returns.

    ``candidates`` are in display space (the data mean added back; not clipped, so nothing is
    hidden from the evaluator, which clips). ``scores`` are the attack's per-candidate numbers
    (the multipliers λ for the stationarity attacks). ``record``: what the run did, the typed
    :class:`~exhume.attacks.engine.record.RunRecord` the attack made (the portfolio's a pooled one), which
    every room above reads as attributes (tests/test_protocol.py checks it). ``provenance``:
    per-candidate tensors of a pooled result (which restart, iteration and rank each candidate comes
    from; see :mod:`exhume.portfolio`), saved as ``provenance_<name>``; empty for a single run.
    ``victim_fingerprint``: :func:`exhume.files.runfolder.fingerprint` of the weights attacked
    (``None`` in runs saved before it was recorded); :func:`exhume.evaluate` refuses another victim.
    """

    method: str
    candidates: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor | None
    record: RunRecord
    seed: int
    loss_history: list[dict[str, float]] = field(default_factory=list)
    victim_path: str | None = None
    provenance: dict[str, torch.Tensor] = field(default_factory=dict)
    victim_fingerprint: str | None = None

    @property
    def config(self) -> dict[str, Any]:
        """``config`` of ``reconstruction.json``, made from :attr:`record` (for files and printing)."""
        return self.record.config_json()

    @property
    def summary(self) -> dict[str, Any]:
        """``summary`` of ``reconstruction.json``, made from :attr:`record` (for files and printing)."""
        return self.record.summary_json()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors of ``reconstruction.safetensors``."""
        tensors = {"candidates": self.candidates.detach().cpu().contiguous(), "labels": self.labels.detach().cpu().contiguous()}
        if self.scores is not None:
            tensors["scores"] = self.scores.detach().cpu().contiguous()
        for name, t in self.provenance.items():
            tensors[f"provenance_{name}"] = t.detach().cpu().contiguous()
        return tensors

    def meta(self) -> dict[str, Any]:
        """The JSON of ``reconstruction.json``."""
        return {"method": self.method, "config": self.config, "seed": self.seed, "summary": self.summary,
                "victim_path": self.victim_path, "victim_fingerprint": self.victim_fingerprint, "loss_history": self.loss_history}

    @classmethod
    def from_parts(cls, meta: dict[str, Any], tensors: dict[str, torch.Tensor], source: str = "the reconstruction") -> Reconstruction:
        """The inverse of :meth:`meta` and :meth:`tensors` (checked: one clear error if they disagree)."""
        if not isinstance(meta, dict) or "method" not in meta or "candidates" not in tensors or "labels" not in tensors:
            raise ExhumeError(f"{source} lacks its method, candidates or labels; expected one written by exhume")
        m = tensors["candidates"].shape[0]
        provenance = {k[len("provenance_"):]: v for k, v in tensors.items() if k.startswith("provenance_")}
        for name, t in [("labels", tensors["labels"]), ("scores", tensors.get("scores")), *provenance.items()]:
            if t is not None and (t.dim() == 0 or t.shape[0] != m):
                raise ExhumeError(f"{source}: {name} has shape {tuple(t.shape)}, expected {m} rows (one per candidate)")
        return cls(method=meta["method"], candidates=tensors["candidates"], labels=tensors["labels"], scores=tensors.get("scores"),
                   record=parse_record(meta.get("config") or {}, meta.get("summary") or {}, source), seed=int(meta.get("seed") or 0),
                   loss_history=meta.get("loss_history") or [], victim_path=meta.get("victim_path"), provenance=provenance,
                   victim_fingerprint=meta.get("victim_fingerprint"))

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors(), str(folder / "reconstruction.safetensors"))
        write_json(folder / "reconstruction.json", self.meta())
        return folder


def load_reconstruction(folder: str | Path) -> Reconstruction:
    folder = Path(folder)
    meta_path, tensor_path = folder / "reconstruction.json", folder / "reconstruction.safetensors"
    for p in (meta_path, tensor_path):
        if not p.is_file():
            raise ExhumeError(f"{p} is missing; expected an attack run folder written by 'exhume attack'")
    meta = read_reconstruction_meta(meta_path)
    try:
        tensors = load_file(str(tensor_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ExhumeError(f"cannot read the reconstruction in {folder}: {e}") from None
    check_reconstruction_tensors(tensors, str(tensor_path))
    recon = Reconstruction.from_parts(meta, tensors, str(folder))
    mark = folder / "victim.fingerprint"  # a portfolio run saved before reconstruction.json recorded the fingerprint
    if recon.victim_fingerprint is None and mark.is_file():
        recon.victim_fingerprint = mark.read_text().strip() or None
    return recon
