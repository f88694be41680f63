"""The daemon's live data, read in thread workers: one named "stream" loads the first state, then
reads the backend's live frames into a `FrameBuffer` and posts a `FramesReady` message only when
none is pending (a slow terminal sees fewer, fuller redraws, never a backlog). The runs list, the
store's health and a fresh snapshot are each read by a worker of their own. Every failure lands in
the app's worker handler, which reconnects after a stream's end."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.app import App

from gpuwarden.core.errors import UserError
from gpuwarden.tui.backend import DashboardBackend, Frame, HistorySeries, SampleFrame
from gpuwarden.tui.controls import OFFLINE
from gpuwarden.tui.live import SERIES_CAPACITY, FrameBuffer
from gpuwarden.tui.messages import Connected, FramesReady, HealthRead, RunsLoaded
from gpuwarden.tui.metrics import CHART_METRICS

# Failures that mean the daemon is not there (or stopped answering) rather than a fault.
UNREACHABLE = frozenset({"not_running", "transport", "timeout"})


class LiveStream:
    """The workers that read `backend` for `app`; `stop` ends the stream (at shutdown)."""

    def __init__(
        self, app: App[Any], backend: DashboardBackend, clock: Callable[[], float], buffer: FrameBuffer
    ) -> None:
        self.app = app
        self.backend = backend
        self.clock = clock
        self.buffer = buffer
        self.stop = threading.Event()
        self.had_connection = False  # a first load has been applied once
        self._ready_posted = threading.Event()

    def _worker(self, body: Callable[[], None], group: str) -> None:
        self.app.run_worker(body, name=group, group=group, thread=True, exclusive=True, exit_on_error=False)

    def connect(self) -> None:
        self._worker(self._follow, "stream")

    def load_runs(self) -> None:
        self._worker(self._read_runs, "runs")

    def read_health(self) -> None:
        self._worker(self._read_health, "health")

    def refresh_snapshot(self) -> None:
        self._worker(self._read_snapshot, "snapshot")

    def take_frames(self) -> list[Frame]:
        """The frames buffered since the last `FramesReady` (the next frame posts another)."""
        self._ready_posted.clear()
        return self.buffer.drain()

    def _follow(self) -> None:
        """Load everything once, then follow the live frames until told to stop."""
        b = self.backend
        status = b.status()
        gpus = b.gpus()
        snapshot = b.snapshot()
        runs = b.runs()
        recent: HistorySeries = {}
        if gpus:
            # Seed the live charts with the last SERIES_CAPACITY seconds at one point a second (the
            # daemon's default tick), so a freshly opened view already shows recent load.
            now = self.clock()
            keys = [m.key for m in CHART_METRICS]
            recent = b.history([g.uuid for g in gpus], keys, now - SERIES_CAPACITY, now, SERIES_CAPACITY)
        self.app.post_message(Connected(status, gpus, snapshot, runs, recent))
        for frame in b.frames(self.stop):
            self._put(frame)
        if not self.stop.is_set():
            raise ConnectionError("the daemon closed the stream")

    def _read_runs(self) -> None:
        self.app.post_message(RunsLoaded(self.backend.runs()))

    def _read_health(self) -> None:
        self.app.post_message(HealthRead(self.backend.storage_fault()))

    def _read_snapshot(self) -> None:
        self._put(SampleFrame(self.backend.snapshot()))

    def _put(self, frame: Frame) -> None:
        self.buffer.put(frame)
        if not self._ready_posted.is_set():
            self._ready_posted.set()
            self.app.post_message(FramesReady())

    def failure(self, error: BaseException | None) -> str:
        """What the toast says when the live stream ends: the first failure may say more (not
        running, a version the dashboard refuses); later, a daemon that went away is the usual
        reason, and anything else is named so it is not mistaken for one."""
        text = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        if isinstance(error, UserError) and not self.had_connection:
            return text
        if isinstance(error, ConnectionError) or (isinstance(error, UserError) and error.code in UNREACHABLE):
            return OFFLINE
        return f"live stream stopped: {text} — reconnecting"
