"""Runs read from their folders (`gpuwarden ps --runs DIR`), not from a daemon.

A run that `gpuwarden exec` supervises inside a cluster job keeps its whole record in its own
folder (`DIR/<id>/run.db`, written by that exec alone, plus its attempts' logs and events).
`RunFolders` answers what the CLI asks the daemon — the runs, one run's detail, its events, a
slice of its log — from those files, read-only, with the same models and the same builders
(`core/run_views.py`), so `ps`, `show`, `logs`, `events` and `--follow` work on them unchanged.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.core import run_views
from gpuwarden.core.api import EventsPage, LogChunk, RunDetail, RunSummary
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_folder import gone_message, run_store_path, supervised
from gpuwarden.core.run_state import FINAL_STATES, RunState
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore

POLL_S = 0.2


class RunFolders:
    """The runs under `root` (each a folder holding `run.db`), read-only. Same calls as the
    daemon's client for what the run commands use."""

    def __init__(self, root: Path, *, only: Path | None = None) -> None:
        """`only`: read that one run folder (under `root` or not), none of its neighbours."""
        if only is None and not root.is_dir():
            raise UserError(f"--runs {root}: no such folder — give the folder that holds the run folders")
        self.root = root
        self._only = only

    @classmethod
    def one(cls, folder: Path) -> RunFolders:
        """The run in `folder` alone (an exec following its own run)."""
        return cls(folder.parent, only=folder)

    def __enter__(self) -> RunFolders:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # -- reading one store ------------------------------------------------------------------------

    def _stores(self) -> Iterator[Path]:
        folders = [self._only] if self._only is not None else sorted(self.root.iterdir())
        for folder in folders:
            path = run_store_path(folder)
            if path.is_file():
                yield path

    @contextlib.contextmanager
    def _open(self, path: Path) -> Iterator[sqlite_utils.Database]:
        db = open_db(path, readonly=True)
        try:
            yield db
        finally:
            db.conn.close()

    def _rows(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every run under the root with the store it is in, newest first. A store that cannot be
        read (being created, damaged) is left out, not fatal: the others still list."""
        found: list[tuple[Path, dict[str, Any]]] = []
        for path in self._stores():
            try:
                with self._open(path) as db:
                    found.extend(
                        (path, as_read(path.parent, row)) for row in RunStore(db).list_runs(limit=10_000)
                    )
            except (UserError, sqlite3.Error):
                continue
        return sorted(found, key=lambda item: float(item[1]["created_at"]), reverse=True)

    def _find(self, ref: str) -> Path:
        """The store of the run `ref` names: id, exact name (the newest), or a unique prefix."""
        rows = self._rows()
        for match in (
            lambda r: r["id"] == ref,
            lambda r: r["name"] == ref,
            lambda r: str(r["id"]).startswith(ref) or str(r["name"]).startswith(ref),
        ):
            hits = [(path, row) for path, row in rows if match(row)]
            names = {row["name"] for _, row in hits}
            if len(hits) == 1 or (hits and len(names) == 1):
                return hits[0][0]
            if hits:
                listed = ", ".join(f"{row['id']} ({row['name']})" for _, row in hits[:5])
                raise UserError(
                    f"'{ref}' matches several runs: {listed} — give more of the id", code="ambiguous"
                )
        raise UserError(
            f"no run matches '{ref}' in {self.root} — see `gpuwarden ps --runs {self.root}`", code="not_found"
        )

    def store_of(self, ref: str) -> Path:
        """The store of the run `ref` names (`report --runs DIR RUN` reads it as `--db`)."""
        return self._find(ref)

    # -- what the run commands ask -------------------------------------------------------------------

    def runs(self, states: Sequence[str] = ()) -> list[RunSummary]:
        rows = [row for _, row in self._rows() if not states or row["state"] in states]
        return [RunSummary.from_row(row) for row in rows]

    def run(self, ref: str) -> RunDetail:
        path = self._find(ref)
        with self._open(path) as db:
            store = RunStore(db)
            return run_views.run_detail(store, TelemetryStore(db), as_read(path.parent, store.resolve(ref)))

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> EventsPage:
        """A page of events; with `wait`, polls the store until there is one or the run ended."""
        path = self._find(ref)
        deadline = time.monotonic() + wait
        while True:
            with self._open(path) as db:
                store = RunStore(db)
                page = run_views.events_page(store, store.resolve(ref)["id"], since, limit)
            if page.state not in FINAL_STATES and not supervised(path.parent):
                page = page.model_copy(update={"state": RunState.INTERRUPTED})
            if page.events or page.state in FINAL_STATES or time.monotonic() >= deadline:
                return page
            time.sleep(POLL_S)

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> LogChunk:
        """A slice of an attempt's output; with `wait`, polls until there is some or it ended."""
        if stream not in ("stdout", "stderr"):
            raise UserError(f"stream {stream!r}: stdout or stderr")
        which: run_views.Stream = "stdout" if stream == "stdout" else "stderr"
        path = self._find(ref)
        deadline = time.monotonic() + wait
        while True:
            with self._open(path) as db:
                store = RunStore(db)
                run = store.resolve(ref)
                chunk = run_views.log_slice(store, run, attempt, which, offset, limit)
            if chunk.data or chunk.eof or time.monotonic() >= deadline:
                return chunk
            time.sleep(POLL_S)


def as_read(folder: Path, row: dict[str, Any]) -> dict[str, Any]:
    """The run's row as a reader should take it: one still active in its record whose folder no
    exec holds any more was interrupted there (its job ended or was killed mid-run), whatever the
    record last said; the next `gpuwarden exec --run` takes it up."""
    if RunState(row["state"]).final or supervised(folder):
        return row
    return {**row, "state": RunState.INTERRUPTED, "message": gone_message(folder, row["state"])}
