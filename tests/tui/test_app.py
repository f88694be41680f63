"""The dashboard driven as a user drives it: keys in, what the screen shows and what the backend
was asked to do out."""

from __future__ import annotations

import time
from typing import Any

from textual.widgets import DataTable, Footer, Input, Log, Static

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.backend import RunFrame, SampleFrame
from gpuwarden.tui.keys import ACTIONS
from gpuwarden.tui.messages import FramesReady
from gpuwarden.tui.screens.dialogs import ConfirmScreen, KnobScreen, MetricsScreen, SubmitScreen
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.history import HistoryBlock, HistoryPane
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from gpuwarden.tui.widgets.gpu_card import GpuCard
from tests.tui.conftest import make_app, run, settle, wait_workers
from tests.tui.fake_backend import FROZEN_TS, FakeBackend

RUNNING = "a1b2c3d4"
STOPPED = "4e5f6a7b"


def text_of(widget: Static) -> str:
    return str(widget.render())


def footer_keys(app: GpuwardenApp) -> set[str]:
    return {a.binding.action for a in app.screen.active_bindings.values() if a.enabled}


def test_overview_shows_cards_host_and_processes() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            cards = list(app.query(GpuCard))
            assert [c.uuid for c in cards] == [g.uuid for g in FakeBackend().gpus()]
            first = text_of(cards[0].text)
            assert "GPU 0" in first and "RTX 4090" in first and "W (" in first and "MHz" in first
            assert "energy 0 J" in first
            host = text_of(app.query_one("#host", Static))
            assert "cpu" in host and "64.0 GiB" in host
            table = app.query_one("#processes", DataTable)
            assert table.row_count == 3
            assert [str(table.get_row_at(i)[0]) for i in range(3)] == ["4242", "5151", "6060"]
            assert str(table.get_row_at(0)[4]) == RUNNING  # the run the process belongs to
            assert not app.query_one("#no-gpu").display

    run(body())


def test_active_throttle_reasons_are_highlighted() -> None:
    async def body() -> None:
        fake = FakeBackend()
        # 60 s past the frozen time the first card is at its power cap (a sw_power_cap bit).
        app = make_app(fake, clock=lambda: FROZEN_TS)
        fake.clock = lambda: FROZEN_TS + 90
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            snap = fake.snapshot()
            assert snap.gpus[0].throttle_reasons == 0x4
            assert "SW_POWER_CAP" in text_of(app.query(GpuCard).first().text)
            # The idle-clock bit of the second card is not throttling, so no badge there.
            assert snap.gpus[1].throttle_reasons in (0, 1)
            assert "GPU_IDLE" not in text_of(app.query(GpuCard).last().text)

    run(body())


def test_no_gpu_says_why_and_keeps_the_host_panel() -> None:
    async def body() -> None:
        app = make_app(FakeBackend.no_gpu())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            line = app.query_one("#no-gpu", Static)
            assert line.display
            assert "no NVIDIA driver found: sampling the host only" in text_of(line)
            assert not list(app.query(GpuCard))
            assert "cpu" in text_of(app.query_one("#host", Static))

    run(body())


def test_metric_key_switches_every_card_chart() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            card = app.query(GpuCard).first()
            assert "chart: utilisation" in text_of(card.text)
            await pilot.press("m")
            assert "chart: memory" in text_of(card.text)
            # The chart's ceiling is the card's memory, so a full chart means a full card.
            assert card.chart.vmax == 24 * 1024**3
            await pilot.press("M")
            assert "chart: utilisation" in text_of(card.text)

    run(body())


def test_runs_table_and_detail_with_retune_and_log() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            table = app.query_one("#runs-table", DataTable)
            rows = [table.get_row_at(i) for i in range(table.row_count)]
            assert [str(r[0]) for r in rows] == ["running", "queued", "failed", "stopped", "succeeded"]
            running = rows[0]
            assert "26%" in str(running[3])  # 12 800 of 50 000 samples
            assert str(running[4]) == "14m35s"  # (50 000 − 12 800) / 42.5 samples/s
            assert str(running[6]) == "1"  # retunes
            await pilot.press("enter")
            await wait_workers(pilot)
            screen = app.screen
            assert isinstance(screen, RunDetailScreen) and screen.summary.id == RUNNING
            timeline = text_of(screen.query_one("#timeline-text", Static))
            assert "train.batch_size" in timeline and "8 → 4" in timeline
            assert "gpu_capacity" in timeline and "reserved_gib=22.9" in timeline
            assert "#1" in timeline and "#2" in timeline and "oom" in timeline
            await pilot.press("l")
            log = screen.query_one("#log-view", Log)
            assert log.line_count >= 80 and "step   790" in "\n".join(log.lines)
            await pilot.press("c")
            labels = [text_of(s) for s in screen.query(".chart-label").results(Static)]
            assert any("of 24.0 GiB card" in label for label in labels)
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)

    run(body())


def test_doctor_tab_shows_findings_with_evidence_and_fix() -> None:
    async def body() -> None:
        backend = FakeBackend()
        app = make_app(backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            await pilot.press("enter")
            await wait_workers(pilot)
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            await pilot.press("d")
            await wait_workers(pilot)
            await pilot.pause()
            text = text_of(screen.query_one("#doctor-text", Static))
            assert "GPU underused: power 52 % of the limit" in text
            assert "evidence: power_w=300, power_limit_w=575, power_pct=52.2" in text
            assert "fix: train.compile: True" in text
            assert ("doctor", RUNNING) in backend.actions

    run(body())


def test_stop_asks_first_and_then_calls_the_backend() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "s")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            await wait_workers(pilot)
            assert ("stop", RUNNING) not in fake.actions
            await pilot.press("s")
            await pilot.press("y")
            await wait_workers(pilot)
            assert ("stop", RUNNING) in fake.actions
            # The state change arrives as a stream frame and the row follows it.
            deadline = time.monotonic() + 3
            table = app.query_one("#runs-table", DataTable)
            while str(table.get_row(RUNNING)[0]) != "stopped":
                assert time.monotonic() < deadline
                await pilot.pause(0.05)

    run(body())


def test_stop_from_the_run_screen() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "enter")
            await wait_workers(pilot)
            await pilot.press("s", "y")
            await wait_workers(pilot)
            assert ("stop", RUNNING) in fake.actions

    run(body())


def test_resume_edit_and_tune_controls() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "down", "down", "down")  # the stopped run
            pane = app.main.runs
            assert pane.selected_id() == STOPPED
            await pilot.press("t")
            await wait_workers(pilot)
            assert ("tune", STOPPED) in fake.actions
            await pilot.press("e")
            assert isinstance(app.screen, KnobScreen)
            await pilot.press(*"train.batch_size", "=", "2")
            await pilot.press("enter")
            await wait_workers(pilot)
            assert ("restart_with", STOPPED, {"train.batch_size": 2}) in fake.actions
            await pilot.press("r")
            await wait_workers(pilot)
            assert ("resume", STOPPED) in fake.actions

    run(body())


def test_knob_dialog_rejects_malformed_input() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "e", *"batch", "enter")
            assert isinstance(app.screen, KnobScreen)
            assert "key=value" in text_of(app.screen.query_one("#knob-error", Static))
            await pilot.press("escape")
            assert not [a for a in fake.actions if a[0] == "restart_with"]

    run(body())


def test_refused_control_is_reported_in_one_line() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "r")  # resume the running run: the backend refuses
            await wait_workers(pilot)
            assert ("resume", RUNNING) in fake.actions
            messages = [n.message for n in app._notifications]
            assert any("only stopped or failed runs resume" in m for m in messages)

    run(body())


def test_submit_with_path_completion(tmp_path: Any) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "finetune.yaml").write_text("name: x\n")

    async def body() -> None:
        fake = FakeBackend()
        app = GpuwardenApp(fake, clock=lambda: FROZEN_TS, cwd=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("n")
            assert isinstance(app.screen, SubmitScreen)
            await pilot.press(*"sp")
            await pilot.pause(0.1)
            await pilot.press("right")  # accept "specs/"
            await pilot.press("f")
            await pilot.pause(0.1)
            await pilot.press("right")  # accept "finetune.yaml"
            assert app.screen.query_one(Input).value == "specs/finetune.yaml"
            await pilot.press("enter")
            await wait_workers(pilot)
            assert ("submit", str(tmp_path / "specs" / "finetune.yaml")) in fake.actions

    run(body())


def test_kill_only_own_stray_processes_after_confirm() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("k")  # first row: pid 4242 belongs to a run
            assert not isinstance(app.screen, ConfirmScreen)
            await pilot.press("down", "down", "k")  # pid 6060 is alice's
            assert not isinstance(app.screen, ConfirmScreen)
            await pilot.press("up", "k")  # pid 5151: a stray notebook of ours
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_workers(pilot)
            assert [a for a in fake.actions if a[0] == "kill"] == [("kill", 5151)]
            deadline = time.monotonic() + 3
            while app.query_one("#processes", DataTable).row_count != 2:
                assert time.monotonic() < deadline
                await pilot.pause(0.05)

    run(body())


def test_history_windows_metric_and_cursor() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            fake.history_calls.clear()
            await pilot.press("3")
            await wait_workers(pilot)
            pane = app.query_one(HistoryPane)
            uuids, metrics, start, end, points = fake.history_calls[-1]
            assert uuids == tuple(g.uuid for g in fake.gpus())
            assert (metrics, end - start, end) == (("util_gpu",), 300.0, FROZEN_TS)
            assert points == 2 * (80 - 4)  # two points per character cell of the chart
            host_metrics, *_ = fake.host_history_calls[-1]
            assert host_metrics == ("cpu_percent", "mem_used", "mem_total")
            await pilot.press("w", "w", "w")
            await wait_workers(pilot)
            assert pane.window == "7d" and pane.loaded == ("7d", ("util_gpu",))
            assert fake.history_calls[-1][3] - fake.history_calls[-1][2] == 7 * 86_400
            block = app.query(HistoryBlock).first()
            assert "▸ 11-21 02:" in text_of(
                block.title
            )  # the cursor starts at the newest point, with the date
            await pilot.press("home")
            chart = block.charts[0]
            assert chart.chart.cursor == 0
            assert "▸ 11-14 03:" in text_of(block.title)  # the middle of the first bucket
            assert text_of(chart.label).startswith("utilisation") and "%" in text_of(chart.label)
            await pilot.press("right", "right")
            assert chart.chart.cursor == 2
            await pilot.press("m")
            await wait_workers(pilot)
            assert fake.history_calls[-1][1] == ("mem_used",)
            chart = app.query(HistoryBlock).first().charts[0]
            assert "GiB" in text_of(chart.label)

    run(body())


def test_history_charts_several_metrics_and_the_host_under_one_cursor() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(100, 40)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await wait_workers(pilot)
            await pilot.press("c")
            assert isinstance(app.screen, MetricsScreen)
            # The list starts on utilisation (ticked); tick power (two down) and apply with enter.
            await pilot.press("down", "down", "space", "enter")
            assert isinstance(app.screen, MainScreen)
            await wait_workers(pilot)
            pane = app.query_one(HistoryPane)
            assert pane.metrics == ("util_gpu", "power_w")
            assert pane.loaded == ("5m", ("util_gpu", "power_w"))
            assert fake.history_calls[-1][1] == ("util_gpu", "power_w")
            blocks = list(app.query(HistoryBlock))
            assert [b.key for b in blocks] == [*(g.uuid for g in fake.gpus()), "host"]
            assert [[c.metric.key for c in b.charts] for b in blocks[:-1]] == [["util_gpu", "power_w"]] * 2
            host = blocks[-1]
            assert [c.metric.key for c in host.charts] == ["cpu_percent", "mem_used"]
            assert host.charts[1].chart.vmax == 64 * 1024**3  # memory's ceiling is the host's total
            # Every chart's value is read at the same moment as the cursor moves.
            await pilot.press("home", "right")
            times = {
                round(c.times[c.chart.cursor]) for b in blocks for c in b.charts if c.chart.cursor is not None
            }
            assert len(times) == 1 and len([c for b in blocks for c in b.charts]) == 6
            power = text_of(blocks[0].charts[1].label)
            assert power.startswith("power") and " W" in power and "max" in power

            # An empty choice is refused in the dialog; esc leaves the charts as they were.
            await pilot.press("c", "space", "down", "down", "space", "enter")
            assert isinstance(app.screen, MetricsScreen)
            assert "at least one" in text_of(app.screen.query_one("#metrics-error", Static))
            await pilot.press("escape")
            assert pane.metrics == ("util_gpu", "power_w")

    run(body())


def test_history_without_gpu_shows_the_hosts_history() -> None:
    async def body() -> None:
        fake = FakeBackend.no_gpu()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await wait_workers(pilot)
            assert "No GPU history" in text_of(app.query_one("#history-empty", Static))
            assert not fake.history_calls  # nothing to ask for GPUs
            (host,) = app.query(HistoryBlock)
            assert all(c.chart.values for c in host.charts)
            assert text_of(host.charts[0].label).startswith("CPU")

    run(body())


def test_readonly_removes_every_control() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake, readonly=True)
        async with app.run_test(size=(120, 30)) as pilot:
            await settle(pilot)
            assert "read-only" in text_of(app.query_one("#status", Static))
            await pilot.press("2")
            shown = footer_keys(app)
            assert not shown & {"stop_run", "resume_run", "edit_run", "tune_run", "submit"}
            await pilot.press("s", "r", "e", "t", "n")
            await pilot.press("enter")
            await wait_workers(pilot)
            await pilot.press("s", "r", "e", "t")
            await wait_workers(pilot)
            assert isinstance(app.screen, RunDetailScreen)
            assert not [a for a in fake.actions if a[0] != "close"]
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert "Overview" in titles and "Stop run" not in titles and "Submit a spec" not in titles
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)

    run(body())


def test_a_database_source_forces_readonly() -> None:
    async def body() -> None:
        app = make_app(FakeBackend(controls=False))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.readonly
            await pilot.press("2", "s")
            assert not isinstance(app.screen, ConfirmScreen)

    run(body())


def test_every_binding_is_in_the_help_table_and_palette_offers_controls() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            documented = {a.action.split("(")[0] for a in ACTIONS}
            screens: list[Any] = [app, app.main, RunDetailScreen, HistoryPane]
            for holder in screens:
                for binding in holder.BINDINGS:
                    assert binding.action.split("(")[0] in documented, binding
            await pilot.press("2")
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert {"Stop run", "Resume run", "Tune run", "Submit a spec", "Help"} <= set(titles)
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)
            assert app.screen.query_one(Footer)

    run(body())


def test_live_updates_coalesce_without_losing_samples() -> None:
    """A burst of frames is applied in few redraws, and every sample reaches the chart."""

    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        handled: list[Any] = []
        async with app.run_test(size=(80, 24), message_hook=handled.append) as pilot:
            await settle(pilot)
            uuid = fake.gpus()[0].uuid
            before = len(app.live.gpus[uuid].series["util_gpu"])
            redraws = app.redraws
            for k in range(1, 201):
                fake.clock = lambda k=k: FROZEN_TS + k
                app.buffer.put(SampleFrame(fake.snapshot()))
                app.post_message(FramesReady())
            app.buffer.put(RunFrame(fake.runs()[1]))
            app.post_message(FramesReady())
            await pilot.pause(0.2)
            after = app.live.gpus[uuid].series["util_gpu"]
            assert len(after) == min(before + 200, after.maxlen or 0)
            assert app.redraws - redraws < 50  # coalesced: far fewer redraws than frames
            assert sum(isinstance(m, FramesReady) for m in handled) < 200

    run(body())


def test_a_live_stream_ticks_into_the_cards() -> None:
    async def body() -> None:
        start = time.time()
        fake = FakeBackend(clock=time.time, interval=0.05)
        app = make_app(fake, clock=time.time)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            deadline = time.monotonic() + 3
            while app.live.snapshot is None or app.live.snapshot.ts < start + 0.2:
                assert time.monotonic() < deadline
                await pilot.pause(0.05)
            uuid = fake.gpus()[0].uuid
            assert app.live.gpus[uuid].energy.joules > 0
            assert "energy 0 J" not in text_of(app.query(GpuCard).first().text)

    run(body())


class _Broken(FakeBackend):
    """Fails the first connection, as a daemon that went away would."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def status(self) -> Any:
        self.attempts += 1
        if self.attempts == 1:
            from gpuwarden.core.errors import UserError

            raise UserError(
                "gpuwarden daemon is not running — start it with `gpuwarden up`", code="not_running"
            )
        return super().status()


def test_lost_connection_is_reported_then_retried() -> None:
    async def body() -> None:
        fake = _Broken()
        app = make_app(fake)
        app.reconnect_s = 0.05
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert fake.attempts == 2
            assert any("not running" in n.message for n in app._notifications)

    run(body())


def test_command_palette_runs_a_control_on_the_selected_run() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "ctrl+p")
            await pilot.pause(0.1)
            await pilot.press(*"Tune run")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.2)
            await wait_workers(pilot)
            assert ("tune", RUNNING) in fake.actions
            # On a run's screen the palette offers that run's controls and not the process one.
            await pilot.press("enter")
            await wait_workers(pilot)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert (
                "Stop run" in titles
                and "Terminate GPU process" not in titles
                and "History metrics" not in titles
            )

    run(body())


def test_command_palette_opens_the_history_metrics_from_another_tab() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            await pilot.press(*"History metrics")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert isinstance(app.screen, MetricsScreen)
            assert app.screen_stack[0].tab == "history"  # type: ignore[attr-defined]
            await pilot.press("down", "space", "enter")  # add memory
            await wait_workers(pilot)
            assert app.query_one(HistoryPane).loaded == ("5m", ("util_gpu", "mem_used"))

    run(body())


def test_a_gpu_that_stops_answering_is_marked_lost() -> None:
    from gpuwarden.core.telemetry.types import GpuSample
    from gpuwarden.tui.backend import Snapshot

    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            uuid = fake.gpus()[1].uuid
            good = fake.snapshot().gpus[0]
            good.ts = FROZEN_TS + 1
            app.buffer.put(
                SampleFrame(Snapshot(FROZEN_TS + 1, [good, GpuSample(FROZEN_TS + 1, uuid, lost=True)]))
            )
            app.post_message(FramesReady())
            await pilot.pause(0.1)
            lost = app.query(GpuCard).last()
            assert "LOST" in text_of(lost.text) and lost.has_class("lost")
            assert "LOST" not in text_of(app.query(GpuCard).first().text)
            assert app.live.gpus[uuid].series["util_gpu"][-1] is None  # a gap in the chart, not a zero

    run(body())
