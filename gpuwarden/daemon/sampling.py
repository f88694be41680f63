"""The sampler thread: every GPU (and the host) read at the configured cadence into the store, the
latest tick kept for placement and the API, old samples rolled up and pruned once an hour.

The daemon and a job's `gpuwarden exec` both sample this way; only what listens to the ticks
differs (the daemon's live stream and Prometheus exporter).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.attempt_energy import Edge, EnergyReading, add_readings
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.sampler import Sampler
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.core.telemetry.types import GpuProcess, GpuReader, GpuStatic, Tick
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.writer import StoreWriter

log = logging.getLogger("gpuwarden.daemon")

RETENTION_EVERY_S = 3600.0
# Ticks queued for the writer beyond this are dropped (and logged) rather than piling up in memory.
MAX_WRITE_BACKLOG = 300


class Sampling:
    """Owns the sampler and its thread. `open` reads the first tick (placement needs it before
    anything starts); `start` begins the cadence; `close` stops it and folds the open minute."""

    def __init__(
        self,
        settings: Settings,
        writer: StoreWriter,
        storage: StorageHealth,
        gpu_reader: GpuReader | None = None,
        open_reader: Callable[[], GpuReader] | None = None,
    ) -> None:
        """`gpu_reader`: the GPUs to read (tests: a fake); else `open_reader()` opens them when
        sampling opens (a job: only its own GPUs), else NVML's (the host only without a driver)."""
        self.settings = settings
        self.writer = writer
        self.storage = storage
        self._gpu_reader = gpu_reader
        self._open_reader = open_reader
        self.sampler: Sampler | None = None
        self.telemetry: TelemetryStore | None = None
        self.latest_tick: Tick | None = None
        self.latest_processes: list[GpuProcess] = []
        # Called on the sampler thread after each tick (keep them fast).
        self.listeners: list[Callable[[Tick], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        # The GPU reader is read by the sampler thread and by the supervisor's counter readings.
        self._reading = threading.Lock()

    # -- what others read -------------------------------------------------------------------------

    def gpu_statics(self) -> list[GpuStatic]:
        return self.sampler.gpus() if self.sampler is not None else []

    @property
    def gpu_status(self) -> str:
        """One line: the GPUs sampled, or why none are."""
        if self.sampler is None:
            return "starting"
        status = self.sampler.status
        if status:
            return str(status)
        gpus = self.sampler.gpus()
        names = sorted({g.name for g in gpus})
        return f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: {', '.join(names)}"

    def gpu_states(self) -> list[GpuState]:
        """Placement's view of the GPUs: static totals plus the latest tick's memory use."""
        if self.sampler is None:
            return []
        latest = {s.uuid: s for s in self.latest_tick.gpus} if self.latest_tick else {}
        states = []
        for g in self.sampler.gpus():
            sample = latest.get(g.uuid)
            total = sample.mem_total if sample and sample.mem_total is not None else g.memory_total
            states.append(
                GpuState(
                    uuid=g.uuid,
                    index=g.index,
                    memory_total=total,
                    memory_used=sample.mem_used if sample else None,
                    lost=bool(sample and sample.lost),
                )
            )
        return states

    def gpu_topology(self) -> GpuTopology:
        """How the GPUs are linked, for placing multi-GPU runs (`place(..., topology=...)`)."""
        return self.sampler.topology() if self.sampler is not None else NO_TOPOLOGY

    def read_energy(self, run_id: str, attempt: int, gpus: Sequence[str], edge: Edge) -> None:
        """Read the energy counters of an attempt's GPUs now, at its `edge`, and store them with it
        (see `EnergyReadings`). Nothing is read before sampling opens; a refused write leaves the
        attempt's energy to its samples."""
        sampler = self.sampler
        if sampler is None or not gpus:
            return
        ts = time.time()
        with self._reading:
            counters = sampler.energy_mj(list(gpus))
        readings = [EnergyReading(run_id, attempt, uuid, edge, ts, mj) for uuid, mj in counters.items()]
        if readings:
            self.writer.submit(lambda db: add_readings(db.conn, readings)).add_done_callback(
                self._stored_reading
            )

    def _stored_reading(self, written: Future[None]) -> None:
        exc = written.exception()
        if exc is not None and self.storage.fault_of(exc) is None:
            log.warning("an attempt's energy counter reading was not stored: %s", exc)

    # -- lifecycle ----------------------------------------------------------------------------------

    def open(self) -> None:
        """Open the GPU reader (NVML, or the host only without a driver) and read the first tick."""
        from gpuwarden.core.telemetry.host import HostReader
        from gpuwarden.core.telemetry.nvml import open_gpu_reader

        reader = self._gpu_reader or (self._open_reader or open_gpu_reader)()
        self.sampler = Sampler(reader, HostReader(), process_interval=self.settings.process_interval)
        self.telemetry = self.writer.call(TelemetryStore)
        self._store_gpus()
        self.tick_once()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the cadence, fold the open minute's samples, release the GPU reader."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.telemetry is not None:
            telemetry = self.telemetry
            try:
                self.writer.call(lambda db: telemetry.flush())
            except Exception as exc:
                if not self.storage.report(exc, database=True):
                    log.exception("flushing telemetry failed")
        if self.sampler is not None:
            self.sampler.close()

    # -- ticks ----------------------------------------------------------------------------------------

    def _store_gpus(self) -> None:
        telemetry, sampler = self.telemetry, self.sampler
        assert telemetry is not None and sampler is not None
        gpus = sampler.gpus()
        self.writer.call(lambda db: telemetry.upsert_gpus(gpus, time.time()))

    def tick_once(self) -> None:
        sampler, telemetry = self.sampler, self.telemetry
        assert sampler is not None and telemetry is not None
        version = sampler.gpus_version
        with self._reading:
            tick: Tick = sampler.tick()
        if sampler.gpus_version != version:
            self._store_gpus()
        self.latest_tick = tick
        if tick.processes is not None:
            self.latest_processes = tick.processes
        if self.writer.backlog > MAX_WRITE_BACKLOG:
            log.warning("store writer is %d jobs behind: dropping a tick", self.writer.backlog)
            self.storage.dropped_sample()
        else:
            self.writer.submit(lambda db: telemetry.write_tick(tick)).add_done_callback(self._stored_tick)
        for listener in self.listeners:
            try:
                listener(tick)
            except Exception:
                log.exception("tick listener failed")

    def _stored_tick(self, written: Future[None]) -> None:
        """A tick the store refused is dropped (and counted): samples do not wait for a disk."""
        exc = written.exception()
        if exc is not None and self.storage.fault_of(exc) is not None:
            self.storage.dropped_sample()

    def _loop(self) -> None:
        interval = self.settings.sample_interval
        next_at = time.monotonic() + interval
        next_retention = time.monotonic() + 60.0
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.tick_once()
            except Exception as exc:
                if not self.storage.report(exc, database=True):
                    log.exception("sampling failed; next tick goes on")
            now = time.monotonic()
            # Fixed cadence without drift; a stall skips the missed ticks instead of bursting.
            next_at += interval
            if next_at < now:
                next_at = now + interval
            if now >= next_retention:
                next_retention = now + RETENTION_EVERY_S
                self._retention()

    def _retention(self) -> None:
        telemetry, r = self.telemetry, self.settings.retention
        assert telemetry is not None

        def job(db: sqlite_utils.Database) -> int:
            deleted = telemetry.enforce_retention(
                time.time(), r.raw_hours, r.minute_days, r.hour_days, r.chunk_rows
            )
            # Keep the planner's statistics fresh: without ANALYZE a rollup query can fall back
            # to a full scan (80-300 ms instead of 3 ms on a busy driver).
            telemetry.optimize()
            return deleted

        self.writer.submit(job)
