"""The daemon: lock, store writer, sampler, supervisor and API server, started and stopped in order.

Threads: `store-writer` (the only database writer), `sampler` (ticks at the configured cadence),
`supervisor` (runs), `socket-watch` (stops a daemon whose socket's file was removed),
`notifications` and one sender per target (only when `notify:` names one), and uvicorn's event
loop on the main thread. Extra components (the Prometheus exporter) attach with
`Daemon.add_component` and receive every tick through `on_tick`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gpuwarden import __version__
from gpuwarden.core.config.settings import MetricsSettings, Settings
from gpuwarden.core.errors import UserError
from gpuwarden.core.paths import Paths
from gpuwarden.core.private import OwnerOf, file_owner
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GpuProcess, GpuReader, GpuSample, GpuStatic, HostSample, Tick
from gpuwarden.daemon.lock import DatabaseLock, InstanceLock
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.private_state import current_umask, enter_owner_only_umask, prepare_private_state
from gpuwarden.daemon.sampling import Sampling
from gpuwarden.daemon.socket_watch import SocketWatch
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.stream import Broadcaster
from gpuwarden.daemon.supervise import RetuneHook
from gpuwarden.daemon.wiring import build_supervisor
from gpuwarden.daemon.writer import StoreWriter

if TYPE_CHECKING:
    from gpuwarden.daemon.notify.component import NotifyComponent

log = logging.getLogger("gpuwarden.daemon")

API_VERSION = "1.0"


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
        self.sampling = Sampling(settings, self.writer, self.storage, gpu_reader)
        self.sampling.listeners.append(self._publish_sample)
        self.components: list[Component] = []
        self.notify = self._notifications(settings)
        # A user's own program writes its files (its outputs, in the user's folders) as it would
        # run directly: with the umask the user started the daemon with, not the daemon's
        # owner-only one. gpuwarden's runners write into run folders and keep owner-only.
        self.supervisor = build_supervisor(
            settings,
            self.paths,
            self.writer,
            self.broadcaster if self.notify is None else self.notify.publisher(self.broadcaster),
            self.sampling,
            retune_hook,
            user_umask=current_umask(),
        )
        if self.notify is not None:
            self.notify.holders = self._gpu_holders
        if settings.metrics.enabled:
            self.add_component(MetricsComponent(self, settings.metrics))
        self.server: Any = None
        self._stop = threading.Event()
        self._readers = threading.local()
        self._shutdown_hooks: list[Callable[[], None]] = []
        self.socket_watch: SocketWatch | None = None
        from gpuwarden.core.telemetry.top import TopReader  # psutil: imported with the sampler's

        # The host's heaviest processes, read when the API is asked (nothing while nobody looks).
        self.top = TopReader()

    def _notifications(self, settings: Settings) -> NotifyComponent | None:
        """Notifications, when `notify:` names a target; else none of it is even imported."""
        if not settings.notify.configured:
            return None
        from gpuwarden.daemon.notify.component import NotifyComponent

        notify = NotifyComponent(
            settings.notify, self.paths.db, self.writer, self.broadcaster, self.sampling.gpu_statics
        )
        self.add_component(notify)
        self.on_tick(notify.on_tick)
        return notify

    def _gpu_holders(self) -> dict[str, tuple[str, ...]]:
        """GPU UUID → the runs whose watched attempts hold it (read from the sampler's thread:
        the copy is taken in one step, so the supervisor changing it meanwhile does no harm)."""
        holders: dict[str, tuple[str, ...]] = {}
        for run_id, active in dict(self.supervisor.active).items():
            for uuid in active.gpus:
                holders[uuid] = (*holders.get(uuid, ()), run_id)
        return holders

    # -- hooks for the lead's components ------------------------------------------------------------

    def add_component(self, component: Component) -> None:
        """Start `component` with the daemon and stop it on shutdown (call before `run`)."""
        self.components.append(component)

    def on_tick(self, callback: Callable[[Tick], None]) -> None:
        """Call `callback(tick)` on the sampler thread after each tick (keep it fast)."""
        self.sampling.listeners.append(callback)

    # -- state others read ----------------------------------------------------------------------------

    @property
    def uptime(self) -> float:
        return time.time() - self.started_at

    @property
    def gpu_status(self) -> str:
        """One line: the GPUs sampled, or why none are."""
        return self.sampling.gpu_status

    @property
    def latest_tick(self) -> Tick | None:
        return self.sampling.latest_tick

    @property
    def latest_processes(self) -> list[GpuProcess]:
        return self.sampling.latest_processes

    def gpu_states(self) -> list[GpuState]:
        """Placement's view of the GPUs: static totals plus the latest tick's memory use."""
        return self.sampling.gpu_states()

    # -- the Prometheus exporter's MetricsSource (gpuwarden.daemon.metrics) ---------------------------

    def gpu_snapshot(self) -> list[tuple[GpuStatic, GpuSample | None]]:
        """Each GPU's static facts with its latest sample (None before the first tick)."""
        tick = self.sampling.latest_tick
        latest = {s.uuid: s for s in tick.gpus} if tick else {}
        return [(g, latest.get(g.uuid)) for g in self.sampling.gpu_statics()]

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

    def telemetry_reader(self) -> TelemetryStore:
        return TelemetryStore(self.read_db())

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Everything but the API server: lock, store, first tick, re-adoption, threads."""
        self._umask = enter_owner_only_umask()
        prepare_private_state(self.paths, self._owner_of)
        if not self.lock.held:
            self.lock.acquire()
        self.db_lock.acquire(self.paths.socket)
        self.writer.start()
        self.sampling.open()
        log.info("gpus: %s", self.gpu_status)
        self.supervisor.start()
        self.sampling.start()
        for component in self.components:
            component.start()
        log.info(
            "gpuwarden daemon %s (pid %d) — db %s, socket %s",
            __version__,
            os.getpid(),
            self.paths.db,
            self.paths.socket,
        )

    def _publish_sample(self, tick: Tick) -> None:
        if self.broadcaster.client_count:
            self.broadcaster.publish(
                "sample",
                {
                    "ts": tick.ts,
                    "gpus": [s.to_dict() for s in tick.gpus],
                    "host": tick.host.to_dict() if tick.host else None,
                },
            )

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
        self.sampling.close()
        self._say_unsettled()
        self.writer.stop()
        if self.socket_watch is not None:
            self.socket_watch.remove_socket()
        if self._umask is not None:
            os.umask(self._umask)
        # The lock stays held until the process exits (see daemon/lock.py).
        log.info("gpuwarden daemon stopped")

    def _say_unsettled(self) -> None:
        """What the store never took: the next daemon settles those runs from their files and
        processes, as after a crash."""
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
