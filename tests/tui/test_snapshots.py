"""SVG snapshots of every screen at 80×24 (an SSH session's default) and 160×48, frozen clock.

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update` and
look at the report before committing the new SVGs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.tui.conftest import make_app, settle, wait_workers
from tests.tui.fake_backend import FakeBackend

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]
Compare = Callable[..., bool]


def keys(*presses: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Settle, press keys one by one letting each answer arrive, settle again."""

    async def before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        for key in presses:
            await pilot.press(key)
            await wait_workers(pilot)

    return before


@pytest.mark.parametrize("size", SIZES)
def test_overview(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys())


@pytest.mark.parametrize("size", SIZES)
def test_runs(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("2"))


@pytest.mark.parametrize("size", SIZES)
def test_run_detail_timeline(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("2", "enter"))


def test_run_detail_charts(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "enter", "c"))


@pytest.mark.parametrize("size", SIZES)
def test_history_7d_with_cursor(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=keys("3", "w", "w", "w", "left", "left"))


def test_no_gpu(snap_compare: Compare) -> None:
    assert snap_compare(make_app(FakeBackend.no_gpu()), run_before=keys())


def test_readonly_runs(snap_compare: Compare) -> None:
    assert snap_compare(make_app(readonly=True), run_before=keys("2"))


def test_help(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("question_mark"))


def test_stop_confirmation(snap_compare: Compare) -> None:
    assert snap_compare(make_app(), run_before=keys("2", "s"))
