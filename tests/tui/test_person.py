"""What a person sees and can do, item by item: live history, resizing, controls per state, the
daemon going away and coming back, machines without a GPU, the run screen and the runs table."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import pytest
from textual import events
from textual.command import CommandPalette
from textual.geometry import Region
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import DataTable, Input, Log, Static
from textual.widgets._footer import FooterKey
from textual.worker import Worker

from gpuwarden.core.api import LogChunk
from gpuwarden.core.errors import UserError
from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.backend import Frame, RunDetailView, SampleFrame
from gpuwarden.tui.controls import OFFLINE
from gpuwarden.tui.formatting import clock as clock_text
from gpuwarden.tui.messages import FramesReady
from gpuwarden.tui.screens.dialogs import KnobScreen, MetricsScreen, SubmitScreen
from gpuwarden.tui.screens.history import HistoryBlock, HistoryPane
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen, Scroller
from gpuwarden.tui.screens.runs import RunsPane
from gpuwarden.tui.widgets.chart import Chart
from tests.tui.conftest import burst, make_app, messages, run, settle, until, wait_workers
from tests.tui.fake_backend import FROZEN_TS, FakeBackend
from tests.tui.test_app import footer_keys, rendered, text_of, timeline_text

RUNNING, QUEUED, SUCCEEDED, FAILED, STOPPED, SCRIPT = (
    "ra1b2c3d4e5", "re5f6a7b8c9", "rc9d0e1f2a3", "r0a1b2c3d4e", "r4e5f6a7b8c", "r7c8d9e0f1a"
)  # fmt: skip
CONTROLS = {"stop_run", "resume_run", "edit_run", "tune_run"}


class Clock:
    """A clock the test moves by hand: the same for the app and its fake backend."""

    def __init__(self) -> None:
        self.now = FROZEN_TS

    def __call__(self) -> float:
        return self.now


async def open_run_screen(pilot: Any, run_id: str) -> RunDetailScreen:
    """From the runs tab, the screen of `run_id` with its detail loaded, as a person opens it."""
    app = pilot.app
    await pilot.press("2")
    runs = app.main.runs
    await until(pilot, lambda: runs.selected_id() is not None, "the runs table")
    runs.select(run_id)
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
    screen = app.screen
    assert isinstance(screen, RunDetailScreen)
    await until(pilot, lambda: screen.detail is not None, "the run's detail")
    return screen


async def _history(pilot: Any) -> HistoryPane:
    await pilot.press("3")
    pane: HistoryPane = pilot.app.query_one(HistoryPane)
    await until(pilot, lambda: pane.loaded is not None and not pane.needs_reload, "the history loaded")
    await wait_workers(pilot)
    return pane


def test_the_five_minute_history_follows_live_samples() -> None:
    async def body() -> None:
        clock = Clock()
        fake = FakeBackend(clock=clock)
        app = make_app(fake, clock=clock)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            pane = await _history(pilot)
            sc = app.query(HistoryBlock).first().charts[0]
            count, step, last = len(sc.points), pane.step, sc.points[-1].ts
            assert "live" in text_of(app.query_one("#history-head", Static))
            await pilot.press("left", "left")  # the cursor on a moment two points back
            moment = sc.points[sc.chart.cursor or 0].ts
            for k in range(1, 4):  # three points' worth of 1 Hz samples
                for _ in range(int(step)):
                    clock.now += 1
                    app.buffer.put(SampleFrame(fake.snapshot()))
                app.post_message(FramesReady())

                def appended(k: int = k) -> bool:
                    return sc.points[-1].ts >= last + k * step - 1e-6

                await until(pilot, appended, f"point {k} appended")
            assert len(sc.points) == count  # appended on the right, dropped on the left
            assert sc.points[-1].value is not None  # the newest point reads a value, not "–"
            assert sc.points[sc.chart.cursor or 0].ts == moment  # the cursor stays on its moment
            assert not [c for c in fake.history_calls if c[3] > FROZEN_TS]  # no fetch: folded in
            # A longer window is fetched again on its cadence, and says how old its newest point is.
            await pilot.press("w")
            await until(pilot, lambda: pane.loaded is not None and pane.loaded[0] == "1h", "the hour")
            calls = len(fake.history_calls)
            clock.now += 31
            app.tick()
            await until(pilot, lambda: len(fake.history_calls) > calls, "the hour fetched again")
            await wait_workers(pilot)
            clock.now += 5
            app.tick()
            assert "newest 5s ago" in text_of(app.query_one("#history-head", Static))
            # The block's time of its newest point is the same moment (not its bucket's, older).
            title = text_of(app.query(HistoryBlock).first().title)
            assert f"▸ {clock_text(clock.now - 5)} (newest)" in title

    run(body())


def test_max_is_the_largest_reading_not_the_largest_mean() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            pane = await _history(pilot)
            await pilot.press("w", "w")  # 24 h: buckets of minutes, whose peaks exceed their means
            await until(pilot, lambda: pane.loaded is not None and pane.loaded[0] == "24h", "a day")
            sc = app.query(HistoryBlock).first().charts[0]
            peak = max(p.peak for p in sc.points if p.peak is not None)
            assert peak > max(p.value for p in sc.points if p.value is not None)
            assert f"max {peak:.0f}%" in text_of(sc.label)

    run(body())


def test_resizing_fetches_again_and_the_charts_use_the_height() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await _history(pilot)
            chart = app.query(HistoryBlock).first().charts[0].chart
            narrow = (chart.plot_width, chart.plot_height)
            await pilot.resize_terminal(120, 40)
            await until(
                pilot, lambda: fake.history_calls[-1][4] == 2 * chart.plot_width, "a fetch for 120 columns"
            )
            await wait_workers(pilot)
            assert chart.plot_width >= narrow[0] + 40
            assert chart.plot_height > narrow[1]  # 40 rows: taller charts, not empty rows
            # The whole width is drawn once the new fetch is applied: the oldest cell is not blank
            # padding (on a loaded machine the repaint can come a frame after the workers end).
            await until(
                pilot,
                lambda: chart.render_line(chart.plot_height - 1).text[chart.y_gutter] != " ",
                "the chart drawn over the whole width",
            )

    run(body())


def test_each_run_offers_only_the_controls_its_state_allows() -> None:
    expected = {
        RUNNING: {"stop_run"},
        QUEUED: {"stop_run", "edit_run", "tune_run"},
        FAILED: {"resume_run", "edit_run", "tune_run"},
        STOPPED: {"resume_run", "edit_run", "tune_run"},
        SCRIPT: {"resume_run", "edit_run", "tune_run"},  # the daemon says whether its roles let it
        SUCCEEDED: set(),
    }

    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            runs = app.main.runs
            await until(pilot, lambda: runs.selected_id() is not None, "the runs table")
            for run_id, allowed in expected.items():
                runs.select(run_id)

                def offered(allowed: set[str] = allowed) -> bool:
                    return footer_keys(app) & CONTROLS == allowed

                await until(pilot, offered, f"{run_id}: controls")
            # On the run's own screen too.
            runs.select(SUCCEEDED)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
            assert not footer_keys(app) & CONTROLS
            await pilot.press("e")
            assert (
                messages(app)[-1]
                == "captcha-bf16 succeeded: a finished run is not changed — run it again with changes (R)"
            )

    run(body())


async def footer_cuts(pilot: Pilot[Any]) -> list[str]:
    """The keys the footer offers now that the screen's bottom line does not show whole."""
    app = pilot.app
    await wait_workers(pilot)
    await until(pilot, lambda: bool(app.screen.query(FooterKey)), "the footer's keys")
    line = app.screen._compositor.render_strips()[-1].text
    keys = [f"{k.key_display} {k.description}".strip() for k in app.screen.query(FooterKey)]
    return [line, *(k for k in keys if k not in line)]


@pytest.mark.slow
def test_every_key_in_the_footer_is_whole_at_80_columns() -> None:
    """The runs tab and the run's screen of runs in every state, on each of the run's tabs: the
    most keys the footer offers at once."""

    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            seen: dict[str, list[str]] = {}
            for tab in "132":
                await pilot.press(tab)
                seen[f"tab {tab}"] = await footer_cuts(pilot)
            for run_id in (RUNNING, QUEUED, SUCCEEDED, FAILED, STOPPED, SCRIPT):
                app.main.runs.select(run_id)
                seen[f"runs {run_id}"] = await footer_cuts(pilot)
                await open_run_screen(pilot, run_id)
                for tab in "acld":
                    await pilot.press(tab)
                    seen[f"{run_id} {tab}"] = await footer_cuts(pilot)
                await pilot.press("escape")
            cut = {where: line_and_cuts for where, line_and_cuts in seen.items() if line_and_cuts[1:]}
            assert not cut

    run(body())


class _Flaky(FakeBackend):
    """A daemon that goes away while `down` is set (the stream ends, new connections fail)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()

    def status(self) -> Any:
        if self.down.is_set():
            raise UserError(
                "gpuwarden daemon is not running — start it with `gpuwarden up`", code="not_running"
            )
        return super().status()

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        for frame in super().frames(stop):
            yield frame
            if self.down.is_set():
                return


@contextlib.asynccontextmanager
async def reconnecting(
    fake: FakeBackend, size: tuple[int, int]
) -> AsyncIterator[tuple[GpuwardenApp, Pilot[None]]]:
    """The dashboard on `fake`, whose frames come every 50 ms, reconnecting every 50 ms, settled."""
    fake.interval = 0.05
    app = make_app(fake)
    app.reconnect_s = 0.05
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        yield app, pilot


def test_without_the_daemon_the_data_is_dimmed_and_controls_are_withdrawn() -> None:
    async def body() -> None:
        fake = _Flaky()
        async with reconnecting(fake, (80, 24)) as (app, pilot):
            await pilot.press("2")
            await until(pilot, lambda: "stop_run" in footer_keys(app), "the controls")
            fake.down.set()
            await until(pilot, lambda: not app.connected, "the lost connection noticed")
            assert OFFLINE in text_of(app.query_one("#status", Static))
            assert app.main.has_class("-offline")  # stale values dimmed
            assert not footer_keys(app) & (CONTROLS | {"submit"})
            await pilot.press("s")
            assert messages(app)[-1] == OFFLINE
            assert not any("ConnectionError" in m for m in messages(app))
            fake.down.clear()
            await until(pilot, lambda: app.connected, "the reconnection")
            assert "daemon reachable again" in messages(app)
            assert not app.main.has_class("-offline") and "stop_run" in footer_keys(app)
            assert app.main.history.needs_reload  # what it showed may have a gap

    run(body())


def test_the_run_screen_says_the_daemon_is_gone() -> None:
    """The run screen has no status line: its head says why its state and log stand still."""

    async def body() -> None:
        fake = _Flaky()
        async with reconnecting(fake, (80, 24)) as (app, pilot):
            screen = await open_run_screen(pilot, RUNNING)
            head = screen.query_one("#run-head", Static)
            fake.down.set()
            await until(pilot, lambda: not app.connected, "the lost connection noticed")
            assert OFFLINE in text_of(head)
            fake.down.clear()
            await until(pilot, lambda: app.connected, "the reconnection")
            await until(pilot, lambda: OFFLINE not in text_of(head), "the head live again")

    run(body())


class _FlakyLogs(_Flaky):
    """Its logs fail too while the daemon is down, as the API's do."""

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        if self.down.is_set():
            raise UserError("gpuwarden daemon is not running — start it with `gpuwarden up`")
        return super().logs(run_id, offset, stream, attempt)


def _log_readers(app: GpuwardenApp) -> list[Worker[Any]]:
    return [w for w in app.workers if w.group == "log" and not w.is_finished]


def test_a_followed_log_goes_on_after_the_daemon_comes_back() -> None:
    async def body() -> None:
        fake = _FlakyLogs()
        async with reconnecting(fake, (80, 24)) as (app, pilot):
            screen = await open_run_screen(pilot, RUNNING)
            await pilot.press("l")
            log = screen.query_one("#log-view", Log)
            await until(pilot, lambda: log.line_count > 0, "the log")
            fake.down.set()
            await until(pilot, lambda: not app.connected, "the lost connection noticed")
            await until(pilot, lambda: not _log_readers(app), "the log's reader stopped by the failure")
            fake.down.clear()
            await until(pilot, lambda: app.connected, "the reconnection")
            with fake._lock:
                fake._logs[RUNNING].append("written after the restart")
            await until(pilot, lambda: "written after the restart" in log.lines, "the log followed again")

    run(body())


class _Garbled(FakeBackend):
    """A daemon that is there but whose live stream breaks on an answer this dashboard refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.garbled = threading.Event()

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        for frame in super().frames(stop):
            if self.garbled.is_set():
                self.garbled.clear()
                raise UserError("the daemon's answer to GET /v1/processes does not fit", code="api_mismatch")
            yield frame


def test_a_stream_that_fails_while_the_daemon_answers_says_why_and_reconnects() -> None:
    async def body() -> None:
        fake = _Garbled()
        async with reconnecting(fake, (100, 30)) as (app, pilot):
            fake.garbled.set()
            wanted = (
                "live stream stopped: the daemon's answer to GET /v1/processes does not fit — reconnecting"
            )
            await until(pilot, lambda: wanted in messages(app), "the reason named")
            assert OFFLINE not in messages(app)
            await until(pilot, lambda: app.connected and not fake.garbled.is_set(), "the reconnection")

    run(body())


def test_a_machine_without_gpu_shows_the_hosts_runs_and_offers_no_gpu_keys() -> None:
    async def body() -> None:
        fake = FakeBackend.no_gpu()
        fake.add_cpu_run("r1111111111", "cpu-train", "running", 777)
        fake.add_cpu_run("r2222222222", "cpu-next", "queued", None)
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            table = app.query_one("#processes", DataTable)
            await until(pilot, lambda: table.row_count == 1, "the host's run listed")
            row = [str(c) for c in table.get_row_at(0)]
            assert row[0] == "777" and row[2] == "cpu" and row[4] == "r1111111111" and "cpu-train" in row[5]
            title = app.query_one("#proc-title", Static)
            await until(
                pilot, lambda: text_of(title) == "Runs on this host (1 working, 1 queued)", "the title"
            )
            await until(pilot, lambda: not footer_keys(app) & {"cycle_metric", "kill_process"}, "no GPU keys")
            await pilot.press("m")
            await until(
                pilot, lambda: any("no GPU to chart" in m for m in messages(app)), "why m does nothing"
            )
            await _history(pilot)
            await pilot.press("c")
            assert isinstance(app.screen, MetricsScreen)
            assert all(key.startswith("host.") for key, _ in app.screen.choices)

    run(body())


def test_a_cpu_run_with_a_long_name_keeps_its_state_in_the_process_table() -> None:
    async def body() -> None:
        fake = FakeBackend.no_gpu()
        fake.add_cpu_run("r1111111111", "own-script-hf-cpu-long-name", "running", 777)
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            table = app.query_one("#processes", DataTable)
            await until(pilot, lambda: table.row_count == 1, "the host's run listed")
            await wait_workers(pilot)
            lines = [strip.text for strip in app.screen._compositor.render_strips()]
            row = next(line for line in lines if "r1111111111" in line)
            assert "own-script-" in row and row.rstrip().endswith("… (train, running)")

    run(body())


def test_the_run_screen_scrolls_explains_and_charts_with_axes() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, FAILED)
            await wait_workers(pilot)
            scroller = screen.query_one("#timeline-scroll", Scroller)
            assert scroller.has_focus  # it scrolls without Tab first
            await pilot.press("j", "j")
            assert scroller.scroll_y == 2
            text = timeline_text(screen)
            assert "out of memory in backward (GPU: tried 2.0 GiB, limit 24 GiB, 512 MiB free)" in text
            assert "memory model: 5 fits; 4 chosen, the largest that divides 32" in text
            assert '"requested"' not in text
            await pilot.press("v")  # the raw evidence, one key away
            shown = timeline_text(screen)
            assert "requested: 2.0 GiB" in shown and "2147483648" not in shown  # in the unit it carries
            await pilot.press("c")
            memory = screen.query_one("#chart-memory").query_one(Chart)
            assert memory.limit == 24 * 1024**3 and memory.x_labels[0][1] == "step 0"
            lines = [memory.render_line(y).text for y in range(memory.plot_height + 1)]
            assert lines[0].strip().startswith("26 GiB┤") and "step 0" in lines[-1]
            label = rendered(screen.query_one("#chart-memory").query_one(".chart-label", Static))
            assert "of 24 GiB" in label and "card's limit" in label

    run(body())


def test_a_succeeded_run_shows_its_energy_and_where_its_output_went() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, SUCCEEDED)
            assert "0.52 J/sample" in timeline_text(screen) and "6.92e+06 samples/kWh" in timeline_text(
                screen
            )
            await pilot.press("l")  # stdout is empty: the log shows stderr, and says so
            head = screen.query_one("#log-head", Static)
            await until(pilot, lambda: "stdout is empty" in text_of(head), "stderr shown")
            await until(
                pilot, lambda: "fused AdamW" in "\n".join(screen.query_one("#log-view", Log).lines), "stderr"
            )
            assert "o: stdout" in text_of(head)

    run(body())


def test_an_empty_log_says_so_and_keeps_its_keys_at_80_columns() -> None:
    async def body() -> None:
        fake = FakeBackend()
        fake.add_cpu_run("r1111111111", "cpu-train", "running", 777)  # nothing written yet
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, "r1111111111")
            await pilot.press("l")
            head = screen.query_one("#log-head", Static)
            await until(pilot, lambda: "stderr is empty" in text_of(head), "both streams read")
            shown = "".join(strip.text for strip in head.render_lines(Region(0, 0, *head.size)))
            assert "o: stdout" in shown and "timeline (a)" in shown

    run(body())


def test_a_command_runs_attempts_show_what_they_were_handed() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, SCRIPT)
            text = timeline_text(screen)
            assert "knobs batch_size=8, grad_accum_steps=2" in text
            assert "training.batch_size 16 → 8, training.grad_accum 1 → 2" in text
            assert "+  batch_size: 8  # per device" in text and "attempt 2 resumes from checkpoint-3" in text

    run(body())


def test_the_runs_table_fits_80_columns_moves_filters_and_sorts() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            runs = app.main.runs
            table = runs.table
            await until(pilot, lambda: table.row_count == 6, "the runs table")
            # Nothing is cut at 80 columns: whole ids, "100%", the ETA; the columns fit the width.
            widths = {str(c.key.value): c.width for c in table.columns.values()}
            assert sum(w + 2 for w in widths.values()) <= 80 and widths["id"] == 11
            cells = {str(table.get_row_at(i)[7]): [str(c) for c in table.get_row_at(i)] for i in range(6)}
            assert set(cells) == {RUNNING, QUEUED, SUCCEEDED, FAILED, STOPPED, SCRIPT}
            assert cells[SUCCEEDED][3].endswith("100%") and len(cells[SUCCEEDED][3]) <= widths["progress"]
            assert cells[RUNNING][4] == "14m35s" and len(cells[RUNNING][4]) <= widths["eta"]
            await pilot.press("end")
            assert runs.selected_id() == SUCCEEDED
            await pilot.press("home", "j", "j")
            assert runs.selected_id() == FAILED
            await pilot.press("k")
            assert runs.selected_id() == QUEUED
            await pilot.press("slash", *"vlm")
            await until(pilot, lambda: table.row_count == 1, "the filter applied")
            await pilot.press("enter")
            assert runs.selected_id() == STOPPED and table.has_focus
            assert "1 of 6 · /vlm" in text_of(runs.query_one("#runs-foot", Static))
            await pilot.press("escape")
            await until(pilot, lambda: table.row_count == 6, "the filter cleared")
            await pilot.press("o", "o")  # state → newest → name
            names = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
            assert names == sorted(names, key=str.lower)
            assert "sorted by name" in text_of(runs.query_one("#runs-foot", Static))

    run(body())


def test_the_status_line_names_the_host() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            status = text_of(app.query_one("#status", Static))
            assert status.startswith("gpuwarden  gpu-box  fake in-memory fake")

    run(body())


def test_v_on_a_run_without_a_retune_says_why_it_shows_nothing() -> None:
    async def body() -> None:
        fake = FakeBackend(clock=lambda: FROZEN_TS)
        fake.add_cpu_run("r1111111111", "cpu-train", "running", 777)  # it never ran out of memory
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, "r1111111111")
            await wait_workers(pilot)
            assert screen.detail is not None and not screen.detail.retunes
            await pilot.press("v")
            await until(
                pilot, lambda: any("no retune in this run" in m for m in messages(app)), "why v shows nothing"
            )

    run(body())


def test_a_filter_typed_in_one_burst_keeps_every_letter() -> None:
    """Over SSH `/stop` arrives in one packet: the letters after `/` are the filter, never keys
    (`s` would offer to stop the selected run, `o` would sort)."""

    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            runs = app.query_one(RunsPane)
            for key, char in [("slash", "/"), ("s", "s"), ("t", "t"), ("o", "o"), ("p", "p")]:
                app.post_message(events.Key(key, char))
            await until(pilot, lambda: runs.query_text == "stop", "the filter typed")
            assert isinstance(app.screen, MainScreen)
            assert "sorted by state" in text_of(runs.query_one("#runs-foot", Static))

    run(body())


@pytest.mark.parametrize(
    ("key", "dialog"), [("n", SubmitScreen), ("e", KnobScreen), ("ctrl+p", CommandPalette)]
)
def test_letters_typed_in_one_burst_after_a_dialog_key_go_into_the_dialog(
    key: str, dialog: type[Screen[Any]]
) -> None:
    """`n`, `e` or ctrl+p and then letters, faster than the dialog opens: every letter lands in
    the dialog's input in order, none is a key of the screen below (`s` stop, `y` yes, `t` tune,
    `q` quit)."""

    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            runs = app.main.runs
            await until(pilot, lambda: runs.selected_id() is not None, "the runs table")
            runs.select(QUEUED)  # a queued run can be stopped, tuned and edited
            await until(
                pilot,
                lambda: {"stop_run", "edit_run", "tune_run"} <= footer_keys(app),
                "the queued run's controls",
            )
            burst(pilot, key, *"sytq")

            def typed() -> str | None:
                return app.focused.value if isinstance(app.focused, Input) else None

            await until(
                pilot, lambda: isinstance(app.screen, dialog) and typed() == "sytq", "the letters typed"
            )
            await wait_workers(pilot)
            assert app.is_running and len(app.screen_stack) == 2
            assert fake.actions == [] and typed() == "sytq"

    run(body())


class Unreadable(FakeBackend):
    """The daemon answers the runs list but not a run's detail (its spec vanished)."""

    def run_detail(self, run_id: str) -> RunDetailView:
        raise UserError(f"run {run_id}: its spec cannot be read", code="not_found")


def test_letters_typed_for_a_knob_dialog_that_cannot_open_act_on_nothing() -> None:
    async def body() -> None:
        fake = Unreadable()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            runs = app.main.runs
            await until(pilot, lambda: runs.selected_id() is not None, "the runs table")
            runs.select(QUEUED)
            await until(pilot, lambda: "edit_run" in footer_keys(app), "the queued run's controls")
            burst(pilot, "e", *"sytq")
            await until(
                pilot, lambda: any("cannot be read" in m for m in messages(app)), "the read's refusal"
            )
            await wait_workers(pilot)
            assert app.is_running and isinstance(app.screen, MainScreen) and fake.actions == []
            await pilot.press("1")  # the keyboard is the main screen's again
            await until(pilot, lambda: app.main.tab == "overview", "the overview")

    run(body())


class ArrowEvidence(FakeBackend):
    """A retune whose evidence says what the daemon writes: `32 → 8`, not ASCII."""

    def run_detail(self, run_id: str) -> RunDetailView:
        detail = super().run_detail(run_id)
        retunes = [
            rt.model_copy(update={"evidence": {**(rt.evidence or {}), "reason": "micro-batch 8 → 4"}})
            for rt in detail.retunes
        ]
        return dataclasses.replace(detail, retunes=retunes)


def test_the_raw_evidence_reads_as_written() -> None:
    async def body() -> None:
        app = make_app(ArrowEvidence())
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, FAILED)
            await wait_workers(pilot)
            await pilot.press("v")
            text = timeline_text(screen)
            assert "reason: micro-batch 8 → 4" in text and "\\u2192" not in text

    run(body())


class TwoSteps(FakeBackend):
    """A short run: three progress reports over two steps, the last step reported twice (its
    final report and the one at the end of training)."""

    def run_detail(self, run_id: str) -> RunDetailView:
        detail = super().run_detail(run_id)
        metrics = [
            m.model_copy(update={"step": step}) for m, step in zip(detail.metrics, [1, 2, 2], strict=False)
        ]
        return dataclasses.replace(detail, metrics=metrics)


def test_a_short_run_charts_each_step_number_once() -> None:
    async def body() -> None:
        app = make_app(TwoSteps())
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            screen = await open_run_screen(pilot, FAILED)
            await wait_workers(pilot)
            await pilot.press("c")
            memory = screen.query_one("#chart-memory").query_one(Chart)
            await until(pilot, lambda: bool(memory.x_labels), "the step axis")
            assert [label for _, label in memory.x_labels] == ["step 1", "2"]

    run(body())
