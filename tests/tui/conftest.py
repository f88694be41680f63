"""Shared pieces of the dashboard tests: a frozen clock in UTC, an app factory, and `settle()`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpuwarden.tui import app as app_module
from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.backend import DashboardBackend
from tests.tui.fake_backend import FROZEN_TS, FakeBackend

# Snapshots print wall-clock times: render them in UTC whatever the machine's zone.
os.environ["TZ"] = "UTC"
time.tzset()


class SaidApp(GpuwardenApp):
    """The app, keeping every toast it showed. A toast goes after its few seconds; on a loaded
    machine a test may look later than that, and must still read what was said."""

    # Textual reads a relative CSS_PATH beside the module of the class: this one's is elsewhere.
    CSS_PATH = str(Path(app_module.__file__).parent / str(GpuwardenApp.CSS_PATH))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.said: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:
        self.said.append(message)
        super().notify(message, **kwargs)


def messages(app: GpuwardenApp) -> list[str]:
    """The notifications shown so far, oldest first, gone ones too."""
    assert isinstance(app, SaidApp), "build the app with make_app() or SaidApp() to read its toasts"
    return list(app.said)


def make_app(
    backend: DashboardBackend | None = None,
    *,
    readonly: bool = False,
    clock: Callable[[], float] | None = None,
) -> GpuwardenApp:
    """The app as every test builds it: a fake backend and a clock stopped at FROZEN_TS."""
    return SaidApp(backend or FakeBackend(), readonly=readonly, clock=clock or (lambda: FROZEN_TS))


# Bounds a failure only (a condition is waited for, never a time): generous, so a loaded machine
# is slower, never red.
SETTLE_S = 60.0


async def settle(pilot: Pilot[Any], *, timeout: float = SETTLE_S) -> None:
    """Wait until the first load has been applied and no short-lived worker is still busy."""
    app = pilot.app
    assert isinstance(app, GpuwardenApp)
    deadline = time.monotonic() + timeout
    while not app.connected:
        assert time.monotonic() < deadline, "the dashboard never connected"
        await pilot.pause(0.02)
    await wait_workers(pilot, deadline)
    # The first process scan arrives with the first load, but on a loaded machine it can land a
    # repaint later; snapshots must not depend on that timing.
    expected = len(app.backend.snapshot().processes or [])
    tables = list(app.query("#processes").results(DataTable))
    while expected and tables and tables[0].row_count < expected:
        assert time.monotonic() < deadline, "the GPU process table was never filled"
        await pilot.pause(0.02)
    await pilot.pause()


async def wait_workers(pilot: Pilot[Any], deadline: float | None = None) -> None:
    """Wait for every worker but the long-lived ones (stream, log tail) to finish, then repaint."""
    deadline = deadline or time.monotonic() + SETTLE_S
    while True:
        busy = [w for w in pilot.app.workers if w.group not in ("stream", "log") and not w.is_finished]
        if not busy:
            break
        assert time.monotonic() < deadline, f"workers still running: {busy}"
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()
    # DataTable measures its rows and columns when its message pump goes idle; on a busy machine a
    # screenshot could otherwise catch header-only column widths (textual/widgets/_data_table.py).
    while any(t._require_update_dimensions or t._updated_cells for t in pilot.app.screen.query(DataTable)):
        assert time.monotonic() < deadline, "a table never finished measuring its columns"
        await pilot.pause(0.02)


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run an async test body (the suite has no asyncio plugin)."""
    import asyncio

    asyncio.run(coro)


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


async def until(
    pilot: Pilot[Any], condition: Callable[[], object], what: str, timeout: float = SETTLE_S
) -> None:
    """Let the app run until `condition()` holds; fail naming `what` after `timeout` seconds (a
    bound for a loaded machine, never a wait that passes by itself)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await pilot.pause(0.02)


def clock_at(ts: float) -> Callable[[], float]:
    """A clock stopped at `ts` (a fresh function per moment: loop variables bind late)."""
    return lambda: ts


def burst(pilot: Pilot[Any], *keys: str) -> None:
    """Keys as a terminal hands over a fast typist's or a paste's: read all at once, the first
    not yet handled when the last arrives (`pilot.press` lets the app go idle after each key)."""
    for key in keys:
        pilot.app.post_message(events.Key(key, key if len(key) == 1 else None))
