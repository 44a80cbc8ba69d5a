"""The run record: what one attack run, or a pooled portfolio of restarts, did — typed.

An attack writes ``Reconstruction.config`` (its settings and what it resolved) and ``.summary`` (what
happened): the two dicts ``reconstruction.json`` holds, with the keys it has always had, read by key
inside ``exhume/attacks/`` only. :attr:`Reconstruction.record <exhume.attacks.base.Reconstruction.record>`
reads them as a :class:`RunRecord`, the one thing the rooms above (evaluation, portfolio, tune,
report, demo, command line, experiments) read, as attributes: the equation solved
(:class:`SolvedEquation`, whose values no room above spells), the threat model, iterations and
seconds, the final relative stationarity and kept iteration, the initialisation and whether it was
oracle, and for a pooled result a :class:`PortfolioRecord` (one :class:`RestartRecord` per restart,
the sizing and batching records). What is private to one attack stays in ``settings`` (the config's
other entries) and ``extras`` (the summary's). Content of the wrong type, or an equation no attack
solves, is one :class:`~exhume.errors.ExhumeError` naming the entry; absent entries (older run
folders) read as ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from exhume.errors import ExhumeError


class SolvedEquation(str, Enum):
    """The equation a run solved (``config["equation_used"]``; absent: ``STATIONARY``)."""

    STATIONARY = "stationary"  # a stationary point of training (the KKT conditions)
    TRAJECTORY = "trajectory"  # the known-start equation on gradients at the final weights
    ENDPOINTS = "endpoints"  # the known-start equation on gradients at the start and the final weights
    SIMULATED = "simulated training"  # training simulated from the start (judged by the endpoints equation)
    EXACT_RUN = "the exact training run"  # the owner's recipe replayed

    @property
    def stationary(self) -> bool:
        """True for the stationarity equation (its multipliers have the margin relation; its residual is KKT's)."""
        return self is SolvedEquation.STATIONARY

    @property
    def known_start_kind(self) -> str | None:
        """The ``kind`` of :class:`~exhume.attacks.equations.KnownStart` that checks a run of this equation (None: stationary)."""
        if self.stationary:
            return None
        return SolvedEquation.ENDPOINTS.value if self is SolvedEquation.SIMULATED else self.value


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """One restart of a portfolio (a row of ``config["portfolio"]["restarts"]``); ``status`` is ``"complete"`` when it finished."""

    restart: int
    status: str
    seed: int | None = None
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    iterations: int | None = None
    seconds: float | None = None
    candidates: int | None = None
    final_relative_stationarity: float | None = None
    host: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PortfolioRecord:
    """A pooled result's restarts and how they were run (``exhume.portfolio`` writes it): ``restarts_complete``
    of them finished; their ``candidates_before_merge`` candidates, near-duplicates merged, left ``candidates``
    (which restart, iteration and rank each comes from: ``Reconstruction.provenance``).

    ``sizing``, ``batched`` and ``study``: the records of :mod:`exhume.portfolio.sizing`, of the batched
    runner and the shared study's name, in the format those modules own. ``saved``: the portfolio
    entry as ``reconstruction.json`` holds it (for :mod:`exhume.portfolio.report`'s tables).
    """

    restarts: tuple[RestartRecord, ...]
    restarts_complete: int | None
    starved_restarts: tuple[int, ...]
    candidates_before_merge: int | None
    candidates: int | None
    restart_seconds_total: float | None
    sizing: Mapping[str, Any] | None
    batched: Mapping[str, Any] | None
    study: str | None
    saved: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What a run did (see the module docstring); build it with :func:`parse_record`.

    ``iterations``/``seconds``: its steps and wall time (a portfolio: the complete restarts' steps, the
    whole wall time); ``kept_iteration``: the iteration whose iterate it returned (None: the last);
    ``final_relative_stationarity``: its own residual of ``equation`` at the returned candidates
    (None: it reports none; a portfolio: per restart, in ``portfolio.restarts``); ``init`` and
    ``oracle_init``: its starting candidates, oracle when built from the training data;
    ``batched_restarts``: the size of the batch it ran in (None: alone); ``iterations_per_restart`` and
    ``residuals_per_restart``: a pooled result's, one per restart (None where one reported none; empty
    for a single run).
    """

    equation: SolvedEquation
    threat_model: str | None
    iterations: int | None
    seconds: float | None
    final_relative_stationarity: float | None
    kept_iteration: int | None
    init: str | None
    oracle_init: bool
    n_guess: int | None
    start_unused: str | None
    batched_restarts: int | None
    iterations_per_restart: tuple[int | None, ...]
    residuals_per_restart: tuple[float | None, ...]
    portfolio: PortfolioRecord | None
    settings: Mapping[str, Any]
    extras: Mapping[str, Any]
    _saved: tuple[Mapping[str, Any], Mapping[str, Any]] = field(repr=False)

    @property
    def best_residual(self) -> tuple[float | None, int]:
        """The lowest final relative residual it reports (over its restarts, when pooled) and how many reported one."""
        per = [float(v) for v in self.residuals_per_restart if v is not None]
        if not per and self.final_relative_stationarity is not None:
            per = [float(self.final_relative_stationarity)]
        return (min(per), len(per)) if per else (None, 0)

    def config_json(self) -> dict[str, Any]:
        """The config as ``reconstruction.json`` holds it (a copy; for files and printing, not for branching on)."""
        return dict(self._saved[0])

    def summary_json(self) -> dict[str, Any]:
        """The summary as ``reconstruction.json`` holds it (a copy; for files and printing, not for branching on)."""
        return dict(self._saved[1])


#: config entries the record types (the rest are the attack's ``settings``)
CONFIG_FIELDS = ("equation_used", "threat_model", "init", "oracle_init", "n_guess", "start_unused", "batched_restarts", "portfolio")
#: summary entries the record types (the rest are the attack's ``extras``)
SUMMARY_FIELDS = ("iterations", "seconds", "final_relative_stationarity", "kept_iteration", "threat_model", "restarts",
                  "restarts_complete", "iterations_per_restart", "seconds_per_restart", "starved_restarts",
                  "candidates_before_merge", "candidates", "final_relative_stationarity_per_restart", "restart_seconds_total")


def _typed(where: str, value: Any, kind: type | tuple[type, ...], expected: str, source: str) -> Any:
    """``value`` when None or of ``kind`` (True and False are no numbers), else one clear error."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise ExhumeError(f"{source}: {where} must be {expected}, got {value!r}; expected a reconstruction written by exhume")


def _number(where: str, value: Any, source: str) -> float | None:
    return _typed(where, value, (int, float), "a number or null", source)


def _integer(where: str, value: Any, source: str) -> int | None:
    return _typed(where, value, int, "an integer or null", source)


def _text(where: str, value: Any, source: str) -> str | None:
    return _typed(where, value, str, "a string or null", source)


def _equation(value: Any, source: str) -> SolvedEquation:
    if value is None:
        return SolvedEquation.STATIONARY
    try:
        return SolvedEquation(value)
    except ValueError:
        known = ", ".join(repr(e.value) for e in SolvedEquation)
        raise ExhumeError(f"{source}: config.equation_used {value!r} is no equation an attack solves; known: {known}") from None


def _restart(k: int, row: Any, source: str) -> RestartRecord:
    where = f"config.portfolio.restarts[{k}]"
    if not isinstance(row, Mapping) or not isinstance(row.get("restart"), int) or not isinstance(row.get("status"), str):
        raise ExhumeError(f"{source}: {where} must be an object with an integer 'restart' and a string 'status', got {row!r}")
    overrides = _typed(f"{where}.overrides", row.get("overrides"), Mapping, "an object", source) or {}
    return RestartRecord(
        restart=row["restart"], status=row["status"], seed=_integer(f"{where}.seed", row.get("seed"), source),
        overrides=MappingProxyType(dict(overrides)), iterations=_integer(f"{where}.iterations", row.get("iterations"), source),
        seconds=_number(f"{where}.seconds", row.get("seconds"), source), candidates=_integer(f"{where}.candidates", row.get("candidates"), source),
        final_relative_stationarity=_number(f"{where}.final_relative_stationarity", row.get("final_relative_stationarity"), source),
        host=_text(f"{where}.host", row.get("host"), source), error=_text(f"{where}.error", row.get("error"), source))


def _per_restart(key: str, summary: Mapping[str, Any], check, source: str) -> tuple[Any, ...]:
    """``summary[key]`` (one value per restart), checked; empty where it is absent (a single run)."""
    values = summary.get(key)
    if values is None:
        return ()
    if not isinstance(values, list):
        raise ExhumeError(f"{source}: summary.{key} must be a list (one value per restart), got {values!r}")
    return tuple(check(f"summary.{key}[{k}]", v, source) for k, v in enumerate(values))


def _portfolio(saved: Any, summary: Mapping[str, Any], source: str) -> PortfolioRecord | None:
    if saved is None:
        return None
    if not isinstance(saved, Mapping) or not isinstance(saved.get("restarts", []), list):
        raise ExhumeError(f"{source}: config.portfolio must be an object with a list of restarts, got {type(saved).__name__}")
    starved = summary.get("starved_restarts") or []
    if not isinstance(starved, list) or not all(isinstance(k, int) for k in starved):
        raise ExhumeError(f"{source}: summary.starved_restarts must be a list of restart numbers, got {starved!r}")
    return PortfolioRecord(
        restarts=tuple(_restart(k, row, source) for k, row in enumerate(saved.get("restarts", []))),
        restarts_complete=_integer("summary.restarts_complete", summary.get("restarts_complete"), source),
        starved_restarts=tuple(starved),
        candidates_before_merge=_integer("summary.candidates_before_merge", summary.get("candidates_before_merge"), source),
        candidates=_integer("summary.candidates", summary.get("candidates"), source),
        restart_seconds_total=_number("summary.restart_seconds_total", summary.get("restart_seconds_total"), source),
        sizing=_typed("config.portfolio.sizing", saved.get("sizing"), Mapping, "an object", source),
        batched=_typed("config.portfolio.batched", saved.get("batched"), Mapping, "an object", source),
        study=_text("config.portfolio.study", saved.get("study"), source), saved=MappingProxyType(dict(saved)))


def parse_record(config: Any, summary: Any, source: str = "the reconstruction") -> RunRecord:
    """The :class:`RunRecord` of a run's ``config`` and ``summary`` dicts (one clear error when they are not a record)."""
    for where, value in (("config", config), ("summary", summary)):
        if not isinstance(value, Mapping):
            raise ExhumeError(f"{source}: its {where} must be an object, got {type(value).__name__}; expected a reconstruction written by exhume")
    threat = config.get("threat_model", summary.get("threat_model"))
    return RunRecord(
        equation=_equation(config.get("equation_used"), source), threat_model=_text("config.threat_model", threat, source),
        iterations=_integer("summary.iterations", summary.get("iterations"), source),
        seconds=_number("summary.seconds", summary.get("seconds"), source),
        final_relative_stationarity=_number("summary.final_relative_stationarity", summary.get("final_relative_stationarity"), source),
        kept_iteration=_integer("summary.kept_iteration", summary.get("kept_iteration"), source),
        init=_text("config.init", config.get("init"), source), oracle_init=bool(config.get("oracle_init")),
        n_guess=_integer("config.n_guess", config.get("n_guess"), source),
        start_unused=_text("config.start_unused", config.get("start_unused"), source),
        batched_restarts=_integer("config.batched_restarts", config.get("batched_restarts"), source),
        iterations_per_restart=_per_restart("iterations_per_restart", summary, _integer, source),
        residuals_per_restart=_per_restart("final_relative_stationarity_per_restart", summary, _number, source),
        portfolio=_portfolio(config.get("portfolio"), summary, source),
        settings=MappingProxyType({k: v for k, v in config.items() if k not in CONFIG_FIELDS}),
        extras=MappingProxyType({k: v for k, v in summary.items() if k not in SUMMARY_FIELDS}),
        _saved=(MappingProxyType(dict(config)), MappingProxyType(dict(summary))))


__all__ = ["PortfolioRecord", "RestartRecord", "RunRecord", "SolvedEquation", "parse_record"]
