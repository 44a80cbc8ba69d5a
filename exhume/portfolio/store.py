"""Where a portfolio keeps its restarts' results, so that nothing finished is ever run again.

**Local** (:class:`LocalStore`): ``OUT/restarts/<k>/`` holds restart ``k``'s checkpoints while it
runs, then its ``reconstruction.*`` (:meth:`Reconstruction.save`) and ``restart.json`` (its plan
record and its row of the portfolio table), written last: a restart counts as finished only when
``restart.json`` is there and records the same settings as the plan asks for.

**Shared** (:class:`ResultTable`): the results of a portfolio spread over machines live in the
study's database itself, in a table ``exhume_portfolio_result`` (created through SQLAlchemy next
to Optuna's tables): one row per finished restart with its reconstruction's JSON and its tensors
as safetensors bytes. Any machine can pool from there; no result stays on the disk of the machine
that ran it. Restarts are claimed through the Optuna study (:mod:`exhume.portfolio.shared`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exhume.attacks import Reconstruction, RestartRecord, load_reconstruction
from exhume.attacks.engine.record import parse_restart
from exhume.errors import ConfigError, ExhumeError
from exhume.files.jsonio import read_json, write_json

TABLE = "exhume_portfolio_result"


class LocalStore:
    """Restart folders under ``out/restarts`` (or nothing at all when ``out`` is None)."""

    def __init__(self, out: str | Path | None) -> None:
        self.root = None if out is None else Path(out) / "restarts"

    def folder(self, k: int) -> Path | None:
        return None if self.root is None else self.root / str(k)

    def load(self, restart) -> tuple[Reconstruction | None, RestartRecord] | None:
        """The stored result of ``restart`` if it finished (or failed) with the same settings, else None."""
        folder = self.folder(restart.index)
        if folder is None or not (folder / "restart.json").is_file():
            return None
        saved = read_json(folder / "restart.json", ExhumeError, "a restart record written by a portfolio (delete the folder to run it again)")
        if not isinstance(saved, dict) or not isinstance(saved.get("row"), dict):
            raise ExhumeError(f"{folder / 'restart.json'}: expected an object with 'plan' and 'row'; delete the folder to run that restart again")
        if _as_planned(saved.get("plan")) != json.loads(json.dumps(restart.record())):
            return None  # other settings: run it again (its checkpoint decides whether it can resume)
        row = parse_restart(saved["row"], str(folder / "restart.json"), "its row")
        return (load_reconstruction(folder) if row.status == "complete" else None), row

    def save(self, restart, recon: Reconstruction | None, row: RestartRecord) -> None:
        folder = self.folder(restart.index)
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        if recon is not None:
            recon.save(folder)
        write_json(folder / "restart.json", {"plan": restart.record(), "row": row.json()}, default=str)  # atomic, written last


def _as_planned(rec: Any) -> Any:
    """A stored restart's plan record as :meth:`Restart.record` writes it now (an older one, whose seconds were an
    attack setting, reads as the same restart); anything else as it is."""
    from exhume.portfolio.plan import Restart

    try:
        return json.loads(json.dumps(Restart.from_record(rec).record()))
    except (KeyError, TypeError, ValueError, AttributeError):
        return rec


def engine_url(url: str) -> str:
    """The SQLAlchemy URL Optuna's storage uses for ``url`` (psycopg2 when psycopg 3 is absent)."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


class ResultTable:
    """Finished restarts of one study, stored in the study's database."""

    def __init__(self, url: str, study_name: str) -> None:
        import sqlalchemy as sa

        self.study = study_name
        url = engine_url(url)
        kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        self.engine = sa.create_engine(url, **kwargs)
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE, meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("study", sa.String(512), nullable=False, index=True),
            sa.Column("restart", sa.Integer, nullable=False),
            sa.Column("trial", sa.Integer, nullable=True),
            sa.Column("host", sa.String(256), nullable=True),
            sa.Column("meta", sa.Text, nullable=False),
            sa.Column("tensors", sa.LargeBinary, nullable=False),
        )
        for attempt in range(6):  # workers started together race to create the table
            try:
                meta.create_all(self.engine, checkfirst=True)
                break
            except Exception as e:  # noqa: BLE001 - IntegrityError / ProgrammingError from the loser of the race
                if attempt == 5:
                    raise ConfigError(f"cannot create the table {TABLE} in the study storage: {type(e).__name__}: {str(e).splitlines()[0]}") from None
                import time

                time.sleep(0.3 * (attempt + 1))

    def save(self, restart: int, recon: Reconstruction | None, row: RestartRecord, trial: int | None, host: str | None) -> None:
        """Store one finished restart (a failed one as its row and no tensors)."""
        from safetensors.torch import save as to_bytes

        meta = json.dumps({"reconstruction": None if recon is None else recon.meta(), "row": row.json()}, default=str)
        blob = b"" if recon is None else to_bytes(recon.tensors())
        with self.engine.begin() as conn:
            conn.execute(self.table.insert().values(study=self.study, restart=restart, trial=trial, host=host,
                                                    meta=meta, tensors=blob))

    def finished(self) -> set[int]:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.table.c.restart).where(self.table.c.study == self.study))
            return {int(r[0]) for r in rows}

    def load_all(self) -> dict[int, tuple[Reconstruction | None, RestartRecord]]:
        """Every finished restart (the first row stored when a restart ran twice); None for a failed one."""
        import sqlalchemy as sa
        from safetensors.torch import load as from_bytes

        out: dict[int, tuple[Reconstruction | None, RestartRecord]] = {}
        query = sa.select(self.table).where(self.table.c.study == self.study).order_by(self.table.c.id)
        with self.engine.connect() as conn:
            for row in conn.execute(query):
                if int(row.restart) in out:
                    continue
                source = f"restart {row.restart} of study {self.study!r}"
                try:
                    meta = json.loads(row.meta)
                    tensors = None if meta["reconstruction"] is None else from_bytes(bytes(row.tensors))
                except Exception as e:  # noqa: BLE001 - a corrupt row is one clear error
                    raise ExhumeError(f"{source}: its stored result is unreadable ({e})") from None
                recon = None if tensors is None else Reconstruction.from_parts(meta["reconstruction"], tensors, source)
                out[int(row.restart)] = (recon, parse_restart(meta["row"], source, "its row"))
        return out

    def dispose(self) -> None:
        self.engine.dispose()
