"""`RunData` over a gpuwarden database opened read-only (`--db PATH`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.core.errors import UserError
from gpuwarden.core.report.data import Series
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore

EVENT_PAGE = 10_000


class DbRunData:
    """Runs and telemetry from the store's own read queries, on a `mode=ro` connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = open_db(path, readonly=True)
        try:
            self.runs = RunStore(self.db)
            self.telemetry = TelemetryStore(self.db)
            # a database from before the run tables existed has nothing to report on
            self.db.conn.execute("SELECT 1 FROM runs LIMIT 1")
        except Exception as exc:  # sqlite3.DatabaseError and friends: not a gpuwarden database
            self.db.conn.close()
            raise UserError(f"{path}: not a gpuwarden database with runs ({exc}) — check --db") from None

    @property
    def source(self) -> str:
        return f"database {self.path}"

    def resolve_run(self, ref: str) -> dict[str, Any]:
        try:
            return self.runs.resolve(ref)
        except UserError as exc:
            if exc.code != "not_found":
                raise
            # `gpuwarden ps` lists the daemon's runs, not this file's: name some of these instead.
            names = sorted({str(r["name"]) for r in self.runs.list_runs(limit=50)})
            held = (
                f"it holds {', '.join(names[:8])}{' …' if len(names) > 8 else ''}"
                if names
                else "it holds no runs"
            )
            raise UserError(
                f"no run matches '{ref[:80]}' in {self.path} — {held}", code="not_found"
            ) from None

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return self.runs.attempts(run_id)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        since = 0
        while True:
            page = self.runs.events(run_id, since=since, limit=EVENT_PAGE)
            out += page
            if len(page) < EVENT_PAGE:
                return out
            since = int(page[-1]["id"])

    def retunes(self, run_id: str) -> list[dict[str, Any]]:
        return self.runs.retunes(run_id)

    def gpu_info(self) -> list[dict[str, Any]]:
        return self.telemetry.gpus()

    def _known(self, uuid: str) -> bool:
        return any(g["uuid"] == uuid for g in self.telemetry.gpus())

    def gpu_series(self, uuid: str, metrics: list[str], start: float, end: float, points: int) -> Series:
        if not self._known(uuid) or end <= start:
            return {m: [] for m in metrics}
        return self.telemetry.history([uuid], metrics, start, end, points).series.get(uuid, {})

    def host_series(self, metrics: list[str], start: float, end: float, points: int) -> Series:
        if end <= start:
            return {m: [] for m in metrics}
        return self.telemetry.host_history(metrics, start, end, points).series.get("host", {})

    def energy(self, uuid: str, start: float, end: float) -> float | None:
        if not self._known(uuid) or end <= start:
            return None
        return self.telemetry.energy_between(uuid, start, end)

    def processes(self, uuid: str, start: float, end: float) -> list[dict[str, Any]] | None:
        if not self._known(uuid):
            return []
        kept = self.telemetry.oldest_process_read()
        if kept is None or end <= kept:
            return None  # retention dropped the reads of this window (or none was ever stored)
        rows = self.telemetry.processes(latest_only=False, uuid=uuid, since=start, until=end)
        return [p.to_dict() for p in rows]

    def close(self) -> None:
        self.db.conn.close()
