"""The daemon: lock, store writer, sampler, supervisor and API server, started and stopped in order.

Threads: `store-writer` (the only database writer), `sampler` (ticks at the configured cadence),
`supervisor` (runs), `socket-watch` (stops a daemon whose socket's file was removed), and
uvicorn's event loop on the main thread. Extra components (the Prometheus exporter) attach with
`Daemon.add_component` and receive every tick through `on_tick`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import psutil

from gpuwarden import __version__
from gpuwarden.core.config.settings import MetricsSettings, Settings
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.classify import read_oom_kill_count
from gpuwarden.core.paths import Paths
from gpuwarden.core.private import OwnerOf, file_owner
from gpuwarden.core.run_state import RunState
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.core.telemetry.types import GpuProcess, GpuReader, GpuSample, GpuStatic, HostSample, Tick
from gpuwarden.daemon.lock import DatabaseLock, InstanceLock
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.private_state import enter_owner_only_umask, prepare_private_state
from gpuwarden.daemon.process import LocalProcesses
from gpuwarden.daemon.socket_watch import SocketWatch
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.stream import Broadcaster
from gpuwarden.daemon.supervise import Backends, Hooks, RetuneHook, Supervisor
from gpuwarden.daemon.writer import StoreWriter

log = logging.getLogger("gpuwarden.daemon")

API_VERSION = "1.0"
RETENTION_EVERY_S = 3600.0
# Ticks queued for the writer beyond this are dropped (and logged) rather than piling up in memory.
MAX_WRITE_BACKLOG = 300


class Component(Protocol):
    """Something that lives as long as the daemon (e.g. the metrics exporter)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Daemon:
    """One user's daemon; `run()` blocks until SIGTERM/SIGINT or `request_shutdown()`."""

    def __init__(
        self,
        settings: Settings,
        paths: Paths | None = None,
        *,
        gpu_reader: GpuReader | None = None,
        retune_hook: RetuneHook | None = None,
        owner_of: OwnerOf = file_owner,
        lock: InstanceLock | None = None,
    ) -> None:
        """`lock`: the instance lock, when the caller took it before loading the daemon."""
        self.settings = settings
        self.paths = paths or settings.resolve_paths()
        self.started_at = time.time()
        self._owner_of = owner_of
        self._umask: int | None = None
        self.lock = (
            lock if lock is not None else InstanceLock(self.paths.lock_file, self.paths.pid_file, owner_of)
        )
        self.db_lock = DatabaseLock(self.paths.db)
        self.storage = StorageHealth(self.paths.db, self.paths.state_dir)
        self.writer = StoreWriter(self.paths.db, self.storage)
        self.broadcaster = Broadcaster()
        self._gpu_reader = gpu_reader
        self.sampler: Any = None
        self.telemetry: TelemetryStore | None = None
        self.latest_tick: Tick | None = None
        self.latest_processes: list[GpuProcess] = []
        self.tick_listeners: list[Callable[[Tick], None]] = []
        self.components: list[Component] = []
        self.supervisor = Supervisor(
            settings,
            self.paths,
            self.writer,
            self.broadcaster,
            local_backends(self.gpu_states, self.gpu_topology),
            self._hooks(retune_hook),
        )
        if settings.metrics.enabled:
            self.add_component(MetricsComponent(self, settings.metrics))
        self.server: Any = None
        self._stop = threading.Event()
        self._sampler_thread = threading.Thread(target=self._sample_loop, name="sampler", daemon=True)
        self._readers = threading.local()
        self._shutdown_hooks: list[Callable[[], None]] = []
        self.socket_watch: SocketWatch | None = None

    def _hooks(self, retune_hook: RetuneHook | None) -> Hooks:
        """The supervisor's decisions: OOM recovery by the run's policy (the product's default,
        swapped out only in tests), autotuning and the memory-tier profile."""
        from gpuwarden.daemon.autotune import Autotuner, apply_profile

        if retune_hook is None:
            from gpuwarden.daemon.oom_retune import OomRetune

            retune_hook = OomRetune(
                gpu_states=self.gpu_states,
                gpu_processes=lambda: self.latest_processes,
                retunes_of=lambda run_id: self.writer.call(lambda db: RunStore(db).retunes(run_id)),
                environment_of=self._stored_environment,
                stopped=self._no_longer_retuning,
            )
        autotune = Autotuner(
            self._gpu_statics,
            self.paths.tune_cache,
            power_limit_command=self.settings.power_limit_command,
            environment_of=self._stored_environment,
        )
        return Hooks(
            retune=retune_hook,
            autotune=autotune,
            profile=lambda spec: apply_profile(spec, self._gpu_statics()),
        )

    # -- hooks for the lead's components ------------------------------------------------------------

    def add_component(self, component: Component) -> None:
        """Start `component` with the daemon and stop it on shutdown (call before `run`)."""
        self.components.append(component)

    def on_tick(self, callback: Callable[[Tick], None]) -> None:
        """Call `callback(tick)` on the sampler thread after each tick (keep it fast)."""
        self.tick_listeners.append(callback)

    # -- state others read ----------------------------------------------------------------------------

    def _gpu_statics(self) -> list[GpuStatic]:
        return self.sampler.gpus() if self.sampler is not None else []

    @property
    def uptime(self) -> float:
        return time.time() - self.started_at

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

    # -- the Prometheus exporter's MetricsSource (gpuwarden.daemon.metrics) ---------------------------

    def gpu_snapshot(self) -> list[tuple[GpuStatic, GpuSample | None]]:
        """Each GPU's static facts with its latest sample (None before the first tick)."""
        if self.sampler is None:
            return []
        latest = {s.uuid: s for s in self.latest_tick.gpus} if self.latest_tick else {}
        return [(g, latest.get(g.uuid)) for g in self.sampler.gpus()]

    def host_snapshot(self) -> HostSample | None:
        return self.latest_tick.host if self.latest_tick else None

    def runs_snapshot(self) -> list[dict[str, Any]]:
        """Runs with attempt/retune counts and latest progress, read on the caller's thread."""
        return self.runs().snapshot()

    def read_db(self) -> sqlite_utils.Database:
        """This thread's read-only connection (API handlers run on a thread pool)."""
        db = getattr(self._readers, "db", None)
        if db is None:
            db = open_db(self.paths.db, readonly=True)
            self._readers.db = db
        return db

    def runs(self) -> RunStore:
        return RunStore(self.read_db())

    def _no_longer_retuning(self, run_id: str) -> bool:
        """Whether a run whose retune is probing was stopped or removed meanwhile."""
        run = self.writer.call(lambda db: RunStore(db).get_run(run_id))
        return run is None or run["state"] != RunState.RETUNING

    def _stored_environment(self, run_id: str) -> dict[str, str] | None:
        """The environment run `run_id` was submitted with, for its probes (on their threads)."""
        return self.writer.call(lambda db: RunStore(db).environment(run_id))

    def telemetry_reader(self) -> TelemetryStore:
        return TelemetryStore(self.read_db())

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Everything but the API server: lock, store, first tick, re-adoption, threads."""
        from gpuwarden.core.telemetry.host import HostReader
        from gpuwarden.core.telemetry.nvml import open_gpu_reader
        from gpuwarden.core.telemetry.sampler import Sampler

        self._umask = enter_owner_only_umask()
        prepare_private_state(self.paths, self._owner_of)
        if not self.lock.held:
            self.lock.acquire()
        self.db_lock.acquire(self.paths.socket)
        self.writer.start()
        reader = self._gpu_reader or open_gpu_reader()
        self.sampler = Sampler(reader, HostReader(), process_interval=self.settings.process_interval)
        self.telemetry = self.writer.call(TelemetryStore)
        self._store_gpus()
        self._tick_once()
        log.info("gpus: %s", self.gpu_status)
        self.supervisor.start()
        self._sampler_thread.start()
        for component in self.components:
            component.start()
        log.info(
            "gpuwarden daemon %s (pid %d) — db %s, socket %s",
            __version__,
            os.getpid(),
            self.paths.db,
            self.paths.socket,
        )

    def _store_gpus(self) -> None:
        telemetry, gpus = self.telemetry, self.sampler.gpus()
        assert telemetry is not None
        self.writer.call(lambda db: telemetry.upsert_gpus(gpus, time.time()))

    def _tick_once(self) -> None:
        version = self.sampler.gpus_version
        tick: Tick = self.sampler.tick()
        if self.sampler.gpus_version != version:
            self._store_gpus()
        self.latest_tick = tick
        if tick.processes is not None:
            self.latest_processes = tick.processes
        telemetry = self.telemetry
        assert telemetry is not None
        if self.writer.backlog > MAX_WRITE_BACKLOG:
            log.warning("store writer is %d jobs behind: dropping a tick", self.writer.backlog)
            self.storage.dropped_sample()
        else:
            self.writer.submit(lambda db: telemetry.write_tick(tick)).add_done_callback(self._stored_tick)
        if self.broadcaster.client_count:
            self.broadcaster.publish(
                "sample",
                {
                    "ts": tick.ts,
                    "gpus": [s.to_dict() for s in tick.gpus],
                    "host": tick.host.to_dict() if tick.host else None,
                },
            )
        for listener in self.tick_listeners:
            try:
                listener(tick)
            except Exception:
                log.exception("tick listener failed")

    def _stored_tick(self, written: Future[None]) -> None:
        """A tick the store refused is dropped (and counted): samples do not wait for a disk."""
        exc = written.exception()
        if exc is not None and self.storage.fault_of(exc) is not None:
            self.storage.dropped_sample()

    def _sample_loop(self) -> None:
        interval = self.settings.sample_interval
        next_at = time.monotonic() + interval
        next_retention = time.monotonic() + 60.0
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self._tick_once()
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

    def serve(self) -> None:
        """Bind the socket and serve the API until asked to stop (blocks)."""
        from gpuwarden.daemon.http import create_app
        from gpuwarden.daemon.server import bind_socket, make_server

        sock = bind_socket(self.paths.socket)
        self.server = make_server(create_app(self))
        self.socket_watch = SocketWatch(self.paths.socket, self.request_shutdown)
        self.socket_watch.start()
        log.info("listening on %s", self.paths.socket)
        try:
            self.server.run(sockets=[sock])
        finally:
            sock.close()

    @property
    def lost_socket(self) -> bool:
        """True when the daemon stopped because its socket's file was removed."""
        return self.socket_watch is not None and self.socket_watch.lost

    @property
    def stopping(self) -> bool:
        """True once shutdown was asked for (API, signal, or close): long requests end early."""
        return self._stop.is_set() or bool(self.server is not None and self.server.should_exit)

    def request_shutdown(self) -> None:
        """Ask the server to stop (from an API handler or another thread)."""
        if self.server is not None:
            self.server.should_exit = True
        self.broadcaster.close_all()

    def close(self) -> None:
        """Stop threads in order, flush the store, remove the socket, release the lock."""
        if not self.lock.held or not self.db_lock.held:
            return  # another daemon owns the socket or the store
        self._stop.set()
        self.broadcaster.close_all()
        for component in reversed(self.components):
            try:
                component.stop()
            except Exception:
                log.exception("component failed to stop")
        self.supervisor.stop()
        if self._sampler_thread.is_alive():
            self._sampler_thread.join(timeout=10)
        self._flush()
        self.writer.stop()
        if self.sampler is not None:
            self.sampler.close()
        if self.socket_watch is not None:
            self.socket_watch.remove_socket()
        if self._umask is not None:
            os.umask(self._umask)
        # The lock stays held until the process exits (see daemon/lock.py).
        log.info("gpuwarden daemon stopped")

    def _flush(self) -> None:
        """Fold the open minute's samples; say what the store never took (the next daemon
        settles the runs from their files and processes, as after a crash)."""
        if self.telemetry is not None:
            telemetry = self.telemetry
            try:
                self.writer.call(lambda db: telemetry.flush())
            except Exception as exc:
                if not self.storage.report(exc, database=True):
                    log.exception("flushing telemetry failed")
        if unsettled := self.supervisor.unsettled:
            log.warning(
                "stopping with %d run updates the store did not take (%s): the next daemon "
                "settles those runs from their processes and files",
                unsettled,
                self.storage.fault or "it refused them",
            )

    def run(self) -> None:
        """start → serve → close."""
        try:
            self.start()
            self.serve()
        finally:
            self.close()


def local_backends(
    gpu_states: Callable[[], list[GpuState]], topology: Callable[[], GpuTopology] = lambda: NO_TOPOLOGY
) -> Backends:
    """The supervisor's backends on this machine: real processes, the wall clock, this cgroup's
    OOM-kill counter, the host's memory, the GPUs' state and links (NVML's topology)."""
    return Backends(
        processes=LocalProcesses(),
        gpu_states=gpu_states,
        clock=time.time,
        oom_kills=read_oom_kill_count,
        host_memory=lambda: int(psutil.virtual_memory().total),
        topology=topology,
    )


class MetricsComponent:
    """The Prometheus exporter as a daemon component (only when `metrics.enabled`)."""

    def __init__(self, daemon: Daemon, settings: MetricsSettings) -> None:
        self._daemon, self._host, self._port = daemon, settings.host, settings.port
        self._ended_runs_s = settings.ended_runs_minutes * 60
        self._server: Any = None

    def start(self) -> None:
        from gpuwarden.daemon.metrics import start_metrics_server

        try:
            self._server = start_metrics_server(self._daemon, self._host, self._port, self._ended_runs_s)
        except OSError as exc:
            raise UserError(
                f"metrics.port {self._port} on {self._host}: {exc.strerror} — choose another port "
                "or set metrics.enabled: false"
            ) from None
        log.info("Prometheus metrics on http://%s:%d/metrics", self._host, self._server.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
