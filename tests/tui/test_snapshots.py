"""SVG snapshots of every screen at 80×24 (an SSH session's default) and 120×40, frozen clock.

Nothing here waits for time to pass: the clock is stopped, the fake backend sends no frames, and
each step waits for a condition (workers done, the history loaded at its final width).

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and
look at the report before committing the new SVGs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.screens.history import HistoryPane
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from tests.tui.conftest import make_app, settle, until, wait_workers
from tests.tui.fake_backend import FakeBackend
from tests.tui.test_storage_health import FAULT

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]
Compare = Callable[..., bool]
FAILED = "r0a1b2c3d4e"
SCRIPT = "r7c8d9e0f1a"
SUCCEEDED = "rc9d0e1f2a3"


async def _steady(pilot: Pilot[Any]) -> None:
    """No worker running, the history at the width it is shown at, the run screen loaded."""
    app = pilot.app
    assert isinstance(app, GpuwardenApp)
    pane = app.query_one(HistoryPane) if app.screen_stack else None
    await wait_workers(pilot)
    if pane is not None and app.main.tab == "history":
        await until(
            pilot,
            lambda: pane._resize_timer is None and pane.loaded == pane.wanted and not pane._loading,
            "the history at its final width",
        )
    if isinstance(app.screen, RunDetailScreen):
        screen = app.screen
        await until(pilot, lambda: screen.detail is not None, "the run's detail")
    for field in app.screen.query(Input):
        field.cursor_blink = False  # a blinking cursor is a clock: the picture must not depend on it
    await wait_workers(pilot)


def keys(*presses: str, select: str | None = None) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Settle, press keys one by one letting each answer arrive, settle again. `select` puts the
    runs table's cursor on a run first (after the first key, which is meant to be "2")."""

    async def before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        app = pilot.app
        assert isinstance(app, GpuwardenApp)
        for i, key in enumerate(presses):
            await pilot.press(key)
            await _steady(pilot)
            if i == 0 and select is not None:
                await until(pilot, lambda: app.main.runs.selected_id() is not None, "the runs table")
                app.main.runs.select(select)
                await _steady(pilot)

    return before


@pytest.mark.parametrize("size", SIZES)
def test_overview(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys())


@pytest.mark.parametrize("size", SIZES)
def test_runs(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("2"))


@pytest.mark.parametrize("size", SIZES)
def test_run_detail_timeline_with_retunes(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("2", "enter", select=FAILED))


def test_run_detail_raw_evidence(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "enter", "v", select=FAILED))


def test_run_detail_of_a_command_run(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "enter", select=SCRIPT))


@pytest.mark.parametrize("size", SIZES)
def test_run_detail_charts(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("2", "enter", "c"))


@pytest.mark.parametrize("size", SIZES)
def test_history(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("3"))


@pytest.mark.parametrize("size", SIZES)
def test_history_7d_with_cursor(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("3", "w", "w", "w", "left", "left"))


@pytest.mark.parametrize("size", SIZES)
def test_no_gpu(snap_compare: Compare, size: tuple[int, int]) -> None:
    fake = FakeBackend.no_gpu()
    fake.add_cpu_run("r1111111111", "cpu-train", "running", 777)
    assert snap_compare(make_app(fake), terminal_size=size, run_before=keys())


def test_readonly_runs(snap_compare: Compare) -> None:
    assert snap_compare(make_app(readonly=True), run_before=keys("2"))


def test_help(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("question_mark"))


def test_stop_confirmation(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "s"))


def test_knob_dialog(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "e", select=SCRIPT))


def test_rerun_dialog(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "R", select=SUCCEEDED))


def test_metrics_chooser(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("3", "c", "down", "down", "space"))


def test_offline(snap_compare: Compare) -> None:
    async def before(pilot: Pilot[Any]) -> None:
        await keys("2")(pilot)
        app = pilot.app
        assert isinstance(app, GpuwardenApp)
        app.set_connected(False)  # what a lost stream leads to (the pilot test drives the real path)
        await wait_workers(pilot)

    assert snap_compare(make_app(), run_before=before)


def _storage_fault(*presses: str) -> tuple[GpuwardenApp, Callable[[Pilot[Any]], Awaitable[None]]]:
    """The app on a daemon that cannot write its database, and its steps to `presses`."""
    fake = FakeBackend()
    fake.fault = FAULT

    async def before(pilot: Pilot[Any]) -> None:
        await keys(*presses)(pilot)
        # The toast with the whole line goes after a while: its time would be the picture's clock.
        pilot.app.clear_notifications()
        await wait_workers(pilot)

    return make_app(fake), before


@pytest.mark.parametrize("size", SIZES)
def test_storage_fault(snap_compare: Compare, size: tuple[int, int]) -> None:
    app, before = _storage_fault()
    assert snap_compare(app, terminal_size=size, run_before=before)


def test_storage_fault_on_a_run_screen(snap_compare: Compare) -> None:
    app, before = _storage_fault("2", "enter")
    assert snap_compare(app, run_before=before)


def test_hosts_tab(snap_compare: Compare) -> None:
    """Several hosts at 80×24: every GPU by free memory, a line for the host that is down."""
    from tests.tui.fake_fleet import FakeFleet

    assert snap_compare(make_app(FakeFleet()), terminal_size=(80, 24), run_before=keys())


def test_runs_of_several_hosts(snap_compare: Compare) -> None:
    from tests.tui.fake_fleet import FakeFleet

    assert snap_compare(make_app(FakeFleet()), terminal_size=(80, 24), run_before=keys("2"))
