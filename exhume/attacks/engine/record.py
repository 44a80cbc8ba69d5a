"""The run record: what one attack run, or a pooled portfolio of restarts, did — typed.

Each attack makes the :class:`RunRecord` of its run (the portfolio a pooled one: a :class:`PortfolioRecord`
of :class:`RestartRecord` rows, completed with :func:`dataclasses.replace`), and the rooms above read it as
attributes: the equation solved (:class:`SolvedEquation`, whose values no room above spells), the threat
model, iterations and seconds, the final relative stationarity and kept iteration, the initialisation.
What is private to one attack stays in ``settings`` (its settings and what it resolved) and ``extras``.

``reconstruction.json`` holds it as the ``config`` and ``summary`` it always had, with the same keys
(:meth:`RunRecord.config_json`, :meth:`RunRecord.summary_json`: what a run did not state is left out);
:func:`parse_record` reads them back once, when a folder is loaded (older ones too: absent entries read
as None), and content of the wrong type, or an equation no attack solves, is one
:class:`~exhume.errors.ExhumeError` naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from exhume.equations.kinds import SolvedEquation
from exhume.errors import ExhumeError

#: the initialisations built from the victim's data (evaluator-side, oracle tools; exhume.evaluation.inits builds them)
ORACLE_INITS = ("ground-truth", "partition", "mix")


def _stated(**entries: Any) -> dict[str, Any]:
    """``entries`` less those that are None (not stated: left out of the file)."""
    return {k: v for k, v in entries.items() if v is not None}


@dataclass(frozen=True)
class RestartRecord:
    """One restart of a portfolio (a row of ``config["portfolio"]["restarts"]``): ``status`` is ``"complete"`` when it
    finished; ``seconds``, ``candidates`` and ``final_relative_stationarity`` are its result's (``candidates`` None:
    it returned none); ``batch``: the size of the batched group it ran in; ``reused``: finished before a resume."""

    restart: int
    status: str
    seed: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    iterations: int | None = None
    seconds: float | None = None
    candidates: int | None = None
    final_relative_stationarity: float | None = None
    host: str | None = None
    batch: int | None = None
    error: str | None = None
    reused: bool = False

    def json(self) -> dict[str, Any]:
        """The row as ``reconstruction.json`` and a stored restart hold it."""
        row = {"restart": self.restart, "seed": self.seed, "overrides": dict(self.overrides), "status": self.status,
               **_stated(iterations=self.iterations)}
        if self.candidates is not None:  # a result: its residual is written even when it reports none
            row.update(seconds=self.seconds, candidates=self.candidates, final_relative_stationarity=self.final_relative_stationarity)
        return {**row, **_stated(host=self.host, batch=self.batch, error=self.error, reused=self.reused or None)}


@dataclass(frozen=True)
class PortfolioRecord:
    """A pooled result's restarts and how they were pooled (:mod:`exhume.portfolio` builds it): ``restarts_complete``
    of them finished, ``starved_restarts`` ran too few iterations (``starved_rule``); their ``candidates_before_merge``
    candidates, near-duplicates merged, left ``candidates`` (which restart, iteration and rank each comes from:
    ``Reconstruction.provenance``); ``restart_seconds_total``: the restarts' own seconds (the record's: the wall time).

    ``pooling``: the portfolio's own entries (the settings that varied, its budget, the merge and rank rules);
    ``sizing``, ``batched`` and ``study``: the records of :mod:`exhume.portfolio.sizing` and of the batched runner,
    and the shared study's name, in the format those modules own.
    """

    restarts: tuple[RestartRecord, ...]
    starved_restarts: tuple[int, ...] = ()
    starved_rule: str | None = None
    candidates_before_merge: int | None = None
    candidates: int | None = None
    restart_seconds_total: float | None = None
    pooling: dict[str, Any] = field(default_factory=dict)
    batched: dict[str, Any] | None = None
    study: str | None = None
    sizing: dict[str, Any] | None = None

    @property
    def restarts_complete(self) -> int:
        return sum(r.status == "complete" for r in self.restarts)

    def config_json(self) -> dict[str, Any]:
        """``config["portfolio"]`` of ``reconstruction.json``."""
        return {"restarts": [r.json() for r in self.restarts], **self.pooling,
                **_stated(batched=self.batched, study=self.study, sizing=self.sizing)}

    def summary_json(self) -> dict[str, Any]:
        """The entries of a pooled result's ``summary`` (the per-restart lists from its rows)."""
        return {"restarts": len(self.restarts), "restarts_complete": self.restarts_complete,
                "iterations_per_restart": [r.iterations for r in self.restarts], "seconds_per_restart": [r.seconds for r in self.restarts],
                "starved_restarts": list(self.starved_restarts), **_stated(starved_rule=self.starved_rule),
                "candidates_before_merge": self.candidates_before_merge, "candidates": self.candidates,
                "final_relative_stationarity_per_restart": [r.final_relative_stationarity for r in self.restarts],
                **_stated(restart_seconds_total=self.restart_seconds_total)}


@dataclass(frozen=True)
class RunRecord:
    """What a run did (see the module docstring); an attack makes it, :func:`parse_record` reads a saved one.

    ``iterations``/``seconds``: its steps and wall time (a portfolio: the complete restarts' steps, the whole wall
    time); ``kept_iteration``: the iteration whose iterate it returned (None: the last);
    ``final_relative_stationarity``: its own residual of ``equation`` at the returned candidates (None: it reports
    none; a portfolio: per restart), defined by ``final_relative_stationarity_note``; ``threat_model``: what the
    attacker knew (None: not stated, nor then a stationary ``equation``); ``init``: its starting candidates (None: it
    takes none), :attr:`oracle_init` when built from the training data; ``start_unused``: why a known start was left
    out; ``batched_restarts``: the size of the batch it ran in (None: alone).
    """

    iterations: int | None = None
    seconds: float | None = None
    equation: SolvedEquation = SolvedEquation.STATIONARY
    threat_model: str | None = None
    final_relative_stationarity: float | None = None
    final_relative_stationarity_note: str | None = None
    kept_iteration: int | None = None
    init: str | None = None
    start_unused: str | None = None
    batched_restarts: int | None = None
    portfolio: PortfolioRecord | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def oracle_init(self) -> bool:
        """Whether its starting candidates were built from the training data (an evaluator's tool, labelled oracle)."""
        return self.init is not None and self.init.split("(")[0] in ORACLE_INITS

    @property
    def n_guess(self) -> int | None:
        """The training-set size it assumed (its ``n_guess`` setting, as it resolved it)."""
        return self.settings.get("n_guess")

    @property
    def best_residual(self) -> tuple[float | None, int]:
        """The lowest final relative residual it reports (over its restarts, when pooled) and how many reported one."""
        rows = () if self.portfolio is None else self.portfolio.restarts
        per = [float(v) for v in (self.final_relative_stationarity, *(r.final_relative_stationarity for r in rows)) if v is not None]
        return (min(per), len(per)) if per else (None, 0)

    def config_json(self) -> dict[str, Any]:
        """``config`` of ``reconstruction.json``: the settings, then the typed entries the run stated."""
        stated = self.threat_model is not None or not self.equation.stationary  # a run that states no threat model: stationary
        return {**self.settings, **_stated(
            init=self.init, oracle_init=None if self.init is None else self.oracle_init, threat_model=self.threat_model,
            equation_used=self.equation.value if stated else None, start_unused=self.start_unused,
            batched_restarts=self.batched_restarts, portfolio=None if self.portfolio is None else self.portfolio.config_json())}

    def summary_json(self) -> dict[str, Any]:
        """``summary`` of ``reconstruction.json``: the typed entries the run stated, then its extras."""
        single = self.portfolio is None  # a single run repeats its threat model here
        return {**_stated(iterations=self.iterations, seconds=self.seconds, final_relative_stationarity=self.final_relative_stationarity,
                          final_relative_stationarity_note=self.final_relative_stationarity_note,
                          threat_model=self.threat_model if single else None, kept_iteration=self.kept_iteration),
                **({} if single else self.portfolio.summary_json()), **self.extras}


#: config entries the record types (the rest are the attack's ``settings``)
CONFIG_FIELDS = ("init", "oracle_init", "threat_model", "equation_used", "start_unused", "batched_restarts", "portfolio")
#: summary entries the record types (the rest are the attack's ``extras``), and those of a pooled result
SUMMARY_FIELDS = ("iterations", "seconds", "final_relative_stationarity", "final_relative_stationarity_note", "threat_model",
                  "kept_iteration")
POOLED_FIELDS = ("restarts", "restarts_complete", "iterations_per_restart", "seconds_per_restart", "starved_restarts",
                 "starved_rule", "candidates_before_merge", "candidates", "final_relative_stationarity_per_restart",
                 "restart_seconds_total")
#: entries of ``config["portfolio"]`` the record types (the rest are its ``pooling``), and a restart's row's simple ones
PORTFOLIO_FIELDS = ("restarts", "batched", "study", "sizing")
ROW_FIELDS = ("seed", "iterations", "seconds", "candidates", "final_relative_stationarity", "host", "batch", "error")


#: how a saved entry is checked, by the type its field declares: the types it may have, and what it must be in words
_KINDS = {"int | None": (int, "an integer or null"), "float | None": ((int, float), "a number or null"),
          "str | None": (str, "a string or null"), "dict[str, Any] | None": (Mapping, "an object")}


def _check(where: str, value: Any, kind: str, source: str) -> Any:
    """``value`` when None or of ``kind`` (a key of :data:`_KINDS`; True and False are no numbers), else one clear error."""
    types, expected = _KINDS[kind]
    if value is None or (isinstance(value, types) and not isinstance(value, bool)):
        return dict(value) if isinstance(value, Mapping) else value
    raise ExhumeError(f"{source}: {where} must be {expected}, got {value!r}; expected a reconstruction written by exhume")


def _read(cls: type, saved: Mapping[str, Any], names: tuple[str, ...], where: str, source: str) -> dict[str, Any]:
    """The entries ``names`` of ``saved`` (absent: None), each checked by the type its field of ``cls`` declares."""
    kinds = {f.name: f.type for f in fields(cls)}
    return {name: _check(f"{where}.{name}", saved.get(name), kinds[name], source) for name in names}


def _equation(value: Any, source: str) -> SolvedEquation:
    if value is None:
        return SolvedEquation.STATIONARY
    try:
        return SolvedEquation(value)
    except ValueError:
        known = ", ".join(repr(e.value) for e in SolvedEquation)
        raise ExhumeError(f"{source}: config.equation_used {value!r} is no equation an attack solves; known: {known}") from None


def parse_restart(row: Any, source: str, where: str = "the restart's row") -> RestartRecord:
    """The :class:`RestartRecord` of a saved row (one clear error naming ``where`` in ``source`` when it is not one)."""
    if not isinstance(row, Mapping) or not isinstance(row.get("restart"), int) or not isinstance(row.get("status"), str):
        raise ExhumeError(f"{source}: {where} must be an object with an integer 'restart' and a string 'status', got {row!r}")
    return RestartRecord(restart=row["restart"], status=row["status"], reused=row.get("reused") is True,
                         overrides=_check(f"{where}.overrides", row.get("overrides"), "dict[str, Any] | None", source) or {},
                         **_read(RestartRecord, row, ROW_FIELDS, where, source))


def _portfolio(saved: Any, summary: Mapping[str, Any], source: str) -> PortfolioRecord | None:
    if saved is None:
        return None
    if not isinstance(saved, Mapping) or not isinstance(saved.get("restarts", []), list):
        raise ExhumeError(f"{source}: config.portfolio must be an object with a list of restarts, got {type(saved).__name__}")
    starved = summary.get("starved_restarts") or []
    if not isinstance(starved, list) or not all(isinstance(k, int) for k in starved):
        raise ExhumeError(f"{source}: summary.starved_restarts must be a list of restart numbers, got {starved!r}")
    return PortfolioRecord(
        restarts=tuple(parse_restart(row, source, f"config.portfolio.restarts[{k}]") for k, row in enumerate(saved.get("restarts", []))),
        starved_restarts=tuple(starved), pooling={k: v for k, v in saved.items() if k not in PORTFOLIO_FIELDS},
        **_read(PortfolioRecord, summary, ("starved_rule", "candidates_before_merge", "candidates", "restart_seconds_total"),
                "summary", source),
        **_read(PortfolioRecord, saved, ("batched", "study", "sizing"), "config.portfolio", source))


def parse_record(config: Any, summary: Any, source: str = "the reconstruction") -> RunRecord:
    """The :class:`RunRecord` of a saved run's ``config`` and ``summary`` (one clear error when they are not a record)."""
    for where, value in (("config", config), ("summary", summary)):
        if not isinstance(value, Mapping):
            raise ExhumeError(f"{source}: its {where} must be an object, got {type(value).__name__}; expected a reconstruction written by exhume")
    _check("config.n_guess", config.get("n_guess"), "int | None", source)
    portfolio = _portfolio(config.get("portfolio"), summary, source)
    typed = SUMMARY_FIELDS + (POOLED_FIELDS if portfolio is not None else ())
    return RunRecord(
        equation=_equation(config.get("equation_used"), source), portfolio=portfolio,
        **_read(RunRecord, summary, ("iterations", "seconds", "final_relative_stationarity", "final_relative_stationarity_note",
                                     "kept_iteration"), "summary", source),
        **_read(RunRecord, {"threat_model": summary.get("threat_model"), **config}, ("threat_model", "init", "start_unused", "batched_restarts"),
                "config", source),
        settings={k: v for k, v in config.items() if k not in CONFIG_FIELDS},
        extras={k: v for k, v in summary.items() if k not in typed})


__all__ = ["PortfolioRecord", "RestartRecord", "RunRecord", "parse_record", "parse_restart"]
