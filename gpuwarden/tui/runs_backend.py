"""`DashboardBackend` over the run folders in one folder (`gpuwarden tui --runs DIR`), read-only.

`gpuwarden exec` keeps each run's whole record in its own folder (`DIR/<id>/run.db`: the daemon's
schema, written by that exec alone). This backend is one `DbBackend` per such store, combined: the
runs of them all, each run's screen from its own store, and the GPUs' samples of them all (a store
holds the GPUs its job used; a GPU that several runs used is one GPU, its samples merged). A run
submitted with `gpuwarden slurm submit` whose job has not started has only its Slurm record so far:
it is listed as queued, as `ps --runs` lists it.

Nothing here writes: each store is opened read-only and every control refuses. Each poll looks for
new folders and asks every store whether a writer committed since it was last read (SQLite's
data_version), so runs appearing and progressing reach the app as run frames, and a store whose
run has ended is never read again.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuwarden.core.api import LogChunk
from gpuwarden.core.errors import UserError
from gpuwarden.core.logtail import NO_LOG, log_chunk
from gpuwarden.core.run_folder import gone_message, run_store_path, supervised
from gpuwarden.core.run_state import RunState
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample
from gpuwarden.slurm.record import read_record
from gpuwarden.tui.backend import (
    DoctorFinding,
    Frame,
    HistorySeries,
    HostSeries,
    HostTop,
    Point,
    RunDetailView,
    RunFrame,
    RunRow,
    SampleFrame,
    Snapshot,
    SourceStatus,
    run_row,
)
from gpuwarden.tui.db_backend import DbBackend
from gpuwarden.tui.readonly_controls import ReadOnlyControls

POLL_S = 1.0
NO_GPU = "these runs' stores hold no GPU (their jobs sampled the host only)"
NO_TOP = HostTop(unavailable="host processes: run folders keep none — a job's machine lists its own")


@dataclass
class _Store:
    """One run folder's store and what was read from it at its `version`."""

    backend: DbBackend
    version: int = -1
    gpus: list[GpuStatic] = field(default_factory=list)
    rows: list[RunRow] = field(default_factory=list)
    snapshot: Snapshot | None = None

    def read(self) -> None:
        """Read it again if a writer committed since the last read."""
        version = self.backend.version()
        if version == self.version:
            return
        self.gpus = self.backend.gpus()  # first: the runs' rows name their GPUs by these indices
        self.rows = self.backend.runs()
        self.snapshot = self.backend.snapshot()
        self.version = version


def _merge(into: dict[str, list[Point]], more: dict[str, list[Point]]) -> None:
    """`more`'s points over `into`'s, bucket by bucket (the same window gives the same buckets in
    every store); a reading wins over a gap, the later store's over the earlier's."""
    for metric, points in more.items():
        by_ts = {p.ts: p for p in into.get(metric, [])}
        for p in points:
            if p.value is not None or p.ts not in by_ts:
                by_ts[p.ts] = p
        into[metric] = sorted(by_ts.values(), key=lambda p: p.ts)


class RunsBackend(ReadOnlyControls):
    """The runs under `root`, each read from its own folder's store."""

    def __init__(self, root: Path, *, clock: Callable[[], float] = time.time) -> None:
        if not root.is_dir():
            raise UserError(f"--runs {root}: no such folder — give the folder that holds the run folders")
        self.root = root
        self.clock = clock
        self.poll_s = POLL_S
        self._lock = threading.Lock()  # the stores and their readings, shared by the app's workers
        self._stores: dict[Path, _Store] = {}
        self._where: dict[str, DbBackend] = {}  # run id → the store that holds it
        self._waiting: dict[str, RunRow] = {}  # run id → its row, while its Slurm job waits
        self._rows: list[RunRow] = []
        if not self._scan():
            self.close()  # the stores that hold no run yet
            raise UserError(self._no_runs())

    def _no_runs(self) -> str:
        if run_store_path(self.root).is_file():
            parent = self.root.parent
            return f"--runs {self.root} is one run's folder — give the folder that holds it: --runs {parent}"
        return (
            f"--runs {self.root}: no run folder in it (none holds a run.db or a Slurm record) — give "
            "the folder `gpuwarden exec` or `gpuwarden slurm submit` wrote to (./gpuwarden-runs by default)"
        )

    def _readonly(self) -> UserError:
        return UserError(
            f"{self.root} is open read-only: a run in a cluster job is stopped through its job "
            "(`gpuwarden slurm cancel RUN`, or the scheduler's own command)",
            code="readonly",
        )

    # -- the folders -------------------------------------------------------------------------

    def _scan(self) -> list[RunRow]:
        """Every run under the root, newest first: the stores that changed are read again, new
        folders are opened, and a folder whose store holds no run yet shows its Slurm record."""
        with self._lock:
            stores: dict[Path, _Store] = {}
            where: dict[str, DbBackend] = {}
            waiting: dict[str, RunRow] = {}
            gone: dict[str, RunRow] = {}
            for folder in self._folders():
                store = self._read(run_store_path(folder))
                if store is not None:
                    stores[folder] = store
                    where.update((row.id, store.backend) for row in store.rows)
                    gone |= {row.id: _gone(folder, row) for row in store.rows if _exec_gone(folder, row)}
                if (store is None or not store.rows) and (record := read_record(folder)) is not None:
                    waiting[record.run_id] = run_row(record.waiting_run())
            # A removed folder's store is dropped, not closed: a worker may still be reading it,
            # and its connection closes once nothing holds it.
            self._stores, self._where, self._waiting = stores, where, waiting
            rows = [gone.get(row.id, row) for store in stores.values() for row in store.rows]
            rows += list(waiting.values())
            self._rows = sorted(rows, key=lambda r: r.created_at, reverse=True)
            return self._rows

    def _folders(self) -> list[Path]:
        """The folders under the root that may be run folders: one we may not enter (a shared
        folder's neighbour) is none of ours, and looking into it would fail."""
        return sorted(p for p in self.root.iterdir() if p.is_dir() and os.access(p, os.X_OK))

    def _read(self, path: Path) -> _Store | None:
        """The store at `path`, read again if it changed. None while it cannot be opened (an exec
        is creating it); the last reading while it cannot be read (a writer holds it too long)."""
        if not path.is_file():
            return None
        known = self._stores.get(path.parent)
        try:
            store = known or _Store(DbBackend(path, clock=self.clock))
            store.read()
        except (UserError, sqlite3.Error):
            return known
        return store

    def _by_age(self) -> list[_Store]:
        """The stores, the one with the oldest reading first: where several hold a GPU, the newer
        readings are applied last."""
        with self._lock:
            stores = list(self._stores.values())
        return sorted(stores, key=lambda s: s.snapshot.ts if s.snapshot else 0.0)

    def _lookup(self, run_id: str) -> DbBackend | RunRow:
        """The store holding `run_id`, or its row while its Slurm job waits (a run that appeared
        since the last scan is looked for)."""
        for scan in (False, True):
            if scan:
                self._scan()
            with self._lock:
                found = self._where.get(run_id) or self._waiting.get(run_id)
            if found is not None:
                return found
        raise UserError(f"no run {run_id} in {self.root} (was its folder removed?)", code="not_found")

    # -- telemetry ---------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        gpus = self.gpus()
        return SourceStatus("runs", str(self.root), sampling=None if gpus else NO_GPU, controls=False)

    def storage_fault(self) -> str | None:
        return None  # nothing here writes the stores: their execs do, and report their own faults

    def gpus(self) -> list[GpuStatic]:
        self._scan()
        merged: dict[str, GpuStatic] = {}
        for store in self._by_age():
            merged.update((gpu.uuid, gpu) for gpu in store.gpus)
        return sorted(merged.values(), key=lambda g: (g.index, g.uuid))

    def snapshot(self) -> Snapshot:
        self._scan()
        return self._snapshot()

    def _snapshot(self) -> Snapshot:
        """Each GPU's newest reading, from whichever store has it, with the processes read with
        it (an older store's are those of a job that has moved on); the newest host reading."""
        snaps = [s.snapshot for s in self._by_age() if s.snapshot is not None]
        latest: dict[str, GpuSample] = {}
        owner: dict[str, int] = {}  # GPU → the reading its newest sample came from
        host: HostSample | None = None
        for i, snap in enumerate(snaps):
            for sample in snap.gpus:
                if sample.uuid not in latest or sample.ts >= latest[sample.uuid].ts:
                    latest[sample.uuid], owner[sample.uuid] = sample, i
            if snap.host is not None and (host is None or snap.host.ts >= host.ts):
                host = snap.host
        processes = [
            p for i, snap in enumerate(snaps) for p in snap.processes or [] if owner.get(p.uuid) == i
        ]
        ts = max([s.ts for s in latest.values()] + ([host.ts] if host else []), default=self.clock())
        return Snapshot(ts, list(latest.values()), host, processes, NO_TOP)

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        merged: HistorySeries = {}
        for store in self._by_age():
            for uuid, series in store.backend.history(gpus, metrics, start, end, points).items():
                _merge(merged.setdefault(uuid, {}), series)
        return merged

    def host_history(self, metrics: Sequence[str], start: float, end: float, points: int) -> HostSeries:
        """The hosts the runs ran on, as one series: a run's job has its machine to itself for
        the run's time, so where two overlap the newer run's reading is shown."""
        merged: HostSeries = {}
        for store in self._by_age():
            _merge(merged, store.backend.host_history(metrics, start, end, points))
        return merged

    # -- runs --------------------------------------------------------------------------------

    def runs(self) -> list[RunRow]:
        return list(self._scan())

    def run_detail(self, run_id: str) -> RunDetailView:
        found = self._lookup(run_id)
        if isinstance(found, RunRow):
            return RunDetailView(found, {}, [], [], [], [])
        return found.run_detail(run_id)

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        found = self._lookup(run_id)
        if isinstance(found, RunRow):
            raise UserError(f"{run_id} has not started (its Slurm job is waiting): nothing to diagnose yet")
        return found.doctor(run_id)

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        found = self._lookup(run_id)
        if isinstance(found, RunRow):
            return log_chunk(NO_LOG, ended=False, attempt=0, stream=stream)
        return found.logs(run_id, offset, stream, attempt)

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        """Every poll: a run frame for each run that appeared or changed, and a sample frame when
        a store has newer readings. A removed run leaves with the app's next `runs()`."""
        with self._lock:
            seen = {row.id: row for row in self._rows}
        last_ts = self._snapshot().ts
        while not stop.wait(self.poll_s):
            rows = self._scan()
            yield from (RunFrame(row) for row in rows if seen.get(row.id) != row)
            seen = {row.id: row for row in rows}
            snap = self._snapshot()
            if snap.ts > last_ts:
                last_ts = snap.ts
                yield SampleFrame(snap)

    def close(self) -> None:
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.backend.close()


def _exec_gone(folder: Path, row: RunRow) -> bool:
    """Whether the row's record says the run is active while no exec holds its folder."""
    return not RunState(row.state).final and not supervised(folder)


def _gone(folder: Path, row: RunRow) -> RunRow:
    """The row as `ps --runs` shows such a run: interrupted where its exec died."""
    return row.model_copy(update={"state": RunState.INTERRUPTED, "message": gone_message(folder, row.state)})
