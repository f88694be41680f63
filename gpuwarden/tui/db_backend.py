"""`DashboardBackend` over an existing database, opened read-only (`gpuwarden tui --db PATH`).

For looking back when no daemon runs (or on a copy of another machine's file). The connection is
SQLite's `mode=ro`, so the dashboard cannot write even by mistake; every control refuses, and the
app hides them because `status().controls` is False. If a daemon is writing the file meanwhile,
`frames()` picks up its new samples by polling.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from gpuwarden.core.api import HistoryAnswer, LogChunk, Retune, RunEvent, RunMetric, RunSummary
from gpuwarden.core.errors import UserError
from gpuwarden.core.logtail import NO_LOG, log_chunk, read_log
from gpuwarden.core.oom.explain import oom_phases
from gpuwarden.core.progress_bar import recorded_bar
from gpuwarden.core.run_state import ACTIVE_STATES, FINAL_STATES
from gpuwarden.core.run_views import attempt_models
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import History, TelemetryStore
from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.tui.api_backend import buckets_to_series, timeline_event
from gpuwarden.tui.backend import (
    FOLDED_EVENTS,
    DoctorFinding,
    Frame,
    HistorySeries,
    HostSeries,
    HostTop,
    ProcessInfo,
    RunDetailView,
    RunRow,
    SampleFrame,
    Snapshot,
    SourceStatus,
    bar_progress,
    doctor_findings,
    reported_number,
    run_row,
)
from gpuwarden.tui.readonly_controls import ReadOnlyControls

POLL_S = 1.0
LOG_CHUNK = 65_536


# A database holds the GPU processes of each read, not the host's: say so instead of an empty list.
NO_TOP = HostTop(
    unavailable="host processes: a database keeps none — they show when the dashboard reads the "
    "daemon (`gpuwarden up`, then `gpuwarden tui`)"
)


def gpu_static(row: dict[str, Any]) -> GpuStatic:
    """A GPU as the store lists it (its static facts plus when it was seen)."""
    names = {f.name for f in dataclasses.fields(GpuStatic)}
    fields = {k: v for k, v in row.items() if k in names}
    fields["unsupported"] = tuple(row.get("unsupported") or ())
    return GpuStatic(**fields)


def _answer(history: History) -> HistoryAnswer:
    return HistoryAnswer.model_validate(history, from_attributes=True)


class DbBackend(ReadOnlyControls):
    """Telemetry and runs from the store's read-only queries."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.db = open_db(path, readonly=True)
        self.telemetry = TelemetryStore(self.db)
        self.store = RunStore(self.db)
        self._lock = threading.Lock()  # one sqlite connection shared by the app's worker threads
        self._statics: dict[str, GpuStatic] = {}
        self.poll_s = POLL_S

    def _readonly(self) -> UserError:
        return UserError(
            f"{self.path} is open read-only: start the daemon (`gpuwarden up`) to act on runs",
            code="readonly",
        )

    # -- telemetry ---------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        gpus = self.gpus()
        return SourceStatus(
            "database",
            str(self.path),
            sampling=None if gpus else "this database holds no GPU (the daemon sampled the host only)",
            controls=False,
        )

    def storage_fault(self) -> str | None:
        return None  # no daemon behind a database opened read-only: nothing here writes it

    def version(self) -> int:
        """SQLite's data_version: it changes whenever another connection (a writer) commits, so a
        reader of many stores reads again only those that changed."""
        with self._lock:
            return int(self.db.conn.execute("PRAGMA data_version").fetchone()[0])

    def gpus(self) -> list[GpuStatic]:
        with self._lock:
            rows = self.telemetry.gpus()
        statics = [gpu_static(r) for r in rows]
        self._statics = {g.uuid: g for g in statics}
        return statics

    def snapshot(self) -> Snapshot:
        with self._lock:
            latest = self.telemetry.latest()
            host = self.telemetry.latest_host()
            procs = self.telemetry.processes()
        samples = [latest[u] for u in self._statics if u in latest]
        ts = max([s.ts for s in samples] + ([host.ts] if host else []), default=self.clock())
        processes = [
            ProcessInfo(
                pid=p.pid,
                uuid=p.uuid,
                gpu_index=self._statics[p.uuid].index if p.uuid in self._statics else None,
                user=p.user,
                used_memory=p.used_memory,
                command=p.cmdline or p.name or "?",
            )
            for p in procs
        ]
        return Snapshot(ts, samples, host, processes, NO_TOP)

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        known = [u for u in gpus if u in self._statics]
        if not known:
            return {}
        with self._lock:
            answer = _answer(self.telemetry.history(known, list(metrics), start, end, points))
        return buckets_to_series(answer, start, end, points)

    def host_history(self, metrics: Sequence[str], start: float, end: float, points: int) -> HostSeries:
        with self._lock:
            answer = _answer(self.telemetry.host_history(list(metrics), start, end, points))
        return buckets_to_series(answer, start, end, points).get("host", {})

    # -- runs --------------------------------------------------------------------------------

    def _indices(self, uuids: list[str]) -> tuple[int, ...]:
        return tuple(self._statics[u].index for u in uuids if u in self._statics)

    def _summary(self, run: dict[str, Any]) -> RunRow:
        attempt = self.store.attempt(run["id"], run["attempt"]) if run["attempt"] else None
        progress = self.store.last_event(run["id"], run["attempt"], ["progress"]) if run["attempt"] else None
        retunes = self.db.conn.execute(
            "SELECT count(*) FROM retunes WHERE run_id = ?", (run["id"],)
        ).fetchone()[0]
        done, total, rate = self._progress(run, progress)
        return run_row(
            RunSummary.from_row(run),
            placed=self._indices(attempt["gpus"] if attempt else []),
            pid=attempt["pid"] if attempt and run["state"] in ACTIVE_STATES else None,
            samples_seen=done,
            total=total,
            samples_per_s=rate if run["state"] in ACTIVE_STATES else None,
            retunes=int(retunes),
        )

    def _progress(
        self, run: dict[str, Any], progress: dict[str, Any] | None
    ) -> tuple[float | None, float | None, float | None]:
        """(done, total, rate): what the run reports, else what its progress bar drew."""
        if progress is not None or not run["attempt"]:
            said = progress or {}
            return (
                reported_number(said.get("samples_seen")),
                reported_number(said.get("total")),
                reported_number(said.get("samples_per_s")),
            )
        drawn = self.store.last_event(run["id"], run["attempt"], ["progress_bar"], source="daemon")
        bar = recorded_bar(drawn or {})
        return bar_progress(bar) if bar is not None else (None, None, None)

    def runs(self) -> list[RunRow]:
        with self._lock:
            return [self._summary(r) for r in self.store.list_runs()]

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        from gpuwarden.core.doctor.diagnose import diagnose_run
        from gpuwarden.core.report.db_data import DbRunData

        return doctor_findings(diagnose_run(DbRunData(self.path), run_id).to_dict())

    def run_detail(self, run_id: str) -> RunDetailView:
        with self._lock:
            run = self.store.resolve(run_id)
            summary = self._summary(run)
            # With the record of what each attempt was handed (knobs, config diff, resume point)
            # and what it resumed from, as the API's run detail has it.
            attempts = attempt_models(self.store, run)
            retunes = [Retune.model_validate(r) for r in self.store.retunes(run["id"])]
            events = [RunEvent.model_validate(e) for e in self.store.events(run["id"], limit=100_000)]
            report = self._report(Path(run["run_dir"]))
            metrics = [RunMetric.model_validate(m) for m in self.store.metrics(run["id"])]
        used = attempts[-1].gpus if attempts else []
        capacity = (
            min((self._statics[u].memory_total or 0 for u in used if u in self._statics), default=0) or None
        )
        return RunDetailView(
            summary,
            run["spec"],
            attempts,
            retunes,
            [timeline_event(e, run["id"]) for e in events if e.type not in FOLDED_EVENTS],
            metrics,
            capacity,
            {uuid: static.index for uuid, static in self._statics.items()},
            oom_phases(events),
            report,
        )

    @staticmethod
    def _report(run_dir: Path) -> dict[str, Any] | None:
        """The run's report.json where the dashboard can read it (it runs where the daemon wrote)."""
        try:
            report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return report if isinstance(report, dict) else None

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        """The log file named in the store (the dashboard runs where the daemon wrote it)."""
        with self._lock:
            run = self.store.resolve(run_id)
            number = attempt or run["attempt"]
            row = self.store.attempt(run["id"], number) if number else None
        if row is None:
            return log_chunk(NO_LOG, ended=run["state"] in FINAL_STATES, attempt=0, stream=stream)
        piece = read_log(Path(row[f"{stream}_path"]), offset, LOG_CHUNK)
        return log_chunk(piece, ended=row["state"] == "ended", attempt=row["attempt"], stream=stream)

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        """New samples written by a daemon (if one is writing the file), checked once a second.
        Run changes reach the app through its own periodic `runs()` poll."""
        last_ts = self.snapshot().ts
        while not stop.wait(self.poll_s):
            snap = self.snapshot()
            if snap.ts > last_ts:
                last_ts = snap.ts
                yield SampleFrame(snap)

    def close(self) -> None:
        self.db.conn.close()
