"""The host's detail on the overview: each core, memory and swap, the heaviest processes — most
of the screen without a GPU, the rows the cards leave with GPUs."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from gpuwarden.core.telemetry.types import HostSample
from gpuwarden.tui.backend import HostTop, TopProcess
from gpuwarden.tui.db_backend import DbBackend
from gpuwarden.tui.screens.overview import OverviewPane
from gpuwarden.tui.widgets.core_bars import core_lines
from gpuwarden.tui.widgets.host_detail import HostDetail, detail_lines
from gpuwarden.tui.widgets.top_table import pick
from tests.tui.conftest import make_app, run, settle
from tests.tui.fake_backend import CORES, FakeBackend
from tests.tui.test_app import text_of

GIB = 1024**3


def plain(lines: list[Text]) -> list[str]:
    return [line.plain for line in lines]


def test_without_a_gpu_the_overview_shows_cores_memory_swap_and_processes_at_80x24() -> None:
    async def body() -> None:
        fake = FakeBackend.no_gpu()
        fake.add_cpu_run("r1111111111", "cpu-train", "running", 777)
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            detail = app.query_one(HostDetail)
            assert detail.display
            shown = text_of(detail).splitlines()
            assert shown[0].startswith("0 ") and f"{CORES - 1} " in shown[1]  # a bar per core
            assert any(line.startswith("mem ") and "/64.0 GiB" in line and "swap" in line for line in shown)
            rows = [line.split() for line in shown if line[:1].isdigit() and len(line.split()) > 5]
            by_pid = {int(r[0]): r for r in rows if r[0].isdigit() and len(r[0]) > 1}
            assert by_pid[777][5] == "cpu-train"  # the run's process, named by its run
            assert by_pid[3310][1] == "alice"  # another user's busy job
            assert 1201 in by_pid  # idle, but the largest in memory
            assert "Runs on this host (1 working)" in text_of(app.query_one("#proc-title", Static))
            pane = app.query_one(OverviewPane)
            assert pane.max_scroll_y == 0  # the detail takes the rows left, no more

    run(body())


def test_with_gpus_the_cards_come_first_and_the_host_gets_the_rows_left() -> None:
    async def body() -> None:
        app = make_app(FakeBackend(1))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert not app.query_one(HostDetail).display  # the card's chart took the rows
        tall = make_app(FakeBackend(1))
        async with tall.run_test(size=(80, 80)) as pilot:
            await settle(pilot)
            detail = tall.query_one(HostDetail)
            assert detail.display and "Heaviest processes" in text_of(detail)
            assert tall.query_one(OverviewPane).max_scroll_y == 0

    run(body())


def test_a_database_says_in_one_line_that_it_keeps_no_host_processes(tmp_path: Path) -> None:
    from gpuwarden.core.store.db import open_db

    open_db(tmp_path / "gpuwarden.db").conn.close()
    backend = DbBackend(tmp_path / "gpuwarden.db")
    try:
        top = backend.snapshot().top
    finally:
        backend.close()
    assert top is not None and top.unavailable and "gpuwarden up" in top.unavailable
    host = HostSample(1.0, cpu_percent=5.0, mem_used=GIB, mem_total=4 * GIB, cpu_cores=[5.0, 5.0])
    lines = plain(detail_lines(host, top, {}, 80, 10))
    assert lines[-1].startswith("host processes: a database keeps none")
    assert len(lines) == 3  # one core line, memory, the reason


def test_many_cores_shrink_their_bars_then_become_one_character_each() -> None:
    assert len(core_lines([50.0] * 8, 76, 2)) == 2  # four wide bars a line
    narrow = core_lines([50.0] * 16, 76, 3)
    assert len(narrow) == 3 and "█" in narrow[0].plain
    blocks = core_lines([100.0] * 128, 76, 2)
    assert len(blocks) == 2 and blocks[0].plain.startswith("cores ") and "█" * 70 in blocks[0].plain
    cut = plain(core_lines([0.0] * 300, 76, 2))
    assert cut[-1].endswith(" +166")  # 70 + 64 shown, the rest counted
    assert core_lines([], 76, 5) == [] and core_lines([1.0], 76, 0) == []


def test_the_rows_left_show_the_busiest_and_the_largest() -> None:
    procs = [TopProcess(i, "u", 100.0 - i, i * GIB, f"p{i}") for i in range(1, 11)]
    chosen = [p.pid for p in pick(procs, 4)]
    assert chosen == [1, 2, 9, 10]  # two busiest, two largest, busiest first
    top = HostTop(procs)
    host = HostSample(1.0, mem_used=GIB, mem_total=2 * GIB, swap_used=GIB, swap_total=4 * GIB)
    lines = plain(detail_lines(host, top, {}, 80, 8))
    assert lines[0].startswith("mem ") and "1.0/4.0 GiB" in lines[0]
    assert lines[1].startswith("Heaviest processes") and lines[2].startswith("PID")
    assert len(lines) == 8
    assert detail_lines(host, top, {}, 80, 2) == []  # a sliver of rows shows nothing
    unread = plain(detail_lines(host, None, {}, 80, 5))
    assert unread[-1] == "host processes: not read yet"


def test_several_hosts_list_their_processes_together_each_naming_its_host() -> None:
    from types import SimpleNamespace

    from gpuwarden.tui.backend import Snapshot
    from gpuwarden.tui.fleet_backend import FleetBackend

    fleet = FleetBackend(SimpleNamespace(names=["gpu1", "gpu2", "gpu3"]))  # type: ignore[arg-type]
    fleet._host_snapshot("gpu1", Snapshot(1.0, top=HostTop([TopProcess(5, "me", 10.0, GIB, "a")])))
    fleet._host_snapshot("gpu2", Snapshot(1.0, top=HostTop([TopProcess(5, "me", 90.0, GIB, "b")])))
    fleet._host_snapshot("gpu3", Snapshot(1.0, top=HostTop(unavailable="old daemon")))
    top = fleet._merged(processes=True).top
    assert top is not None and top.unavailable is None
    assert [(p.host, p.command) for p in top.processes] == [("gpu2", "b"), ("gpu1", "a")]
    line = plain(detail_lines(None, top, {}, 80, 5))[2]
    assert line.split()[-2:] == ["gpu2:", "b"]


def test_a_wide_terminal_without_a_gpu_fills_without_scrolling() -> None:
    async def body() -> None:
        app = make_app(FakeBackend.no_gpu())
        async with app.run_test(size=(160, 40)) as pilot:
            await settle(pilot)
            detail = app.query_one(HostDetail)
            assert detail.display and "bash" in text_of(detail)  # every process has a row
            assert app.query_one(OverviewPane).max_scroll_y == 0

    run(body())
