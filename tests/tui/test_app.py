"""The dashboard driven as a user drives it: keys in, what the screen shows and what the backend
was asked to do out."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console
from textual.command import CommandPalette
from textual.containers import VerticalScroll
from textual.geometry import Region
from textual.widgets import DataTable, Footer, Input, Log, SelectionList, Static

from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.backend import RunFrame, SampleFrame
from gpuwarden.tui.keys import ACTIONS
from gpuwarden.tui.messages import FramesReady
from gpuwarden.tui.screens.dialogs import ConfirmScreen, KnobScreen, MetricsScreen, SubmitScreen
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.history import HistoryBlock, HistoryPane
from gpuwarden.tui.screens.hosts import HostsPane
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen, Scroller
from gpuwarden.tui.screens.runs import RunsPane
from gpuwarden.tui.widgets.gpu_card import GpuCard
from gpuwarden.tui.widgets.nav_table import NavTable
from gpuwarden.tui.widgets.program_log import ProgramLog
from tests.tui.conftest import (
    SETTLE_S,
    SaidApp,
    clock_at,
    make_app,
    messages,
    run,
    settle,
    until,
    wait_workers,
)
from tests.tui.fake_backend import FROZEN_TS, FakeBackend

RUNNING = "ra1b2c3d4e5"
STOPPED = "r4e5f6a7b8c"
SCRIPT = "r7c8d9e0f1a"
FAILED = "r0a1b2c3d4e"


def text_of(widget: Static) -> str:
    return str(widget.render())


def rendered(widget: Static, width: int = 1000) -> str:
    """What a widget shows, as plain text (wide: no wrapping to think about)."""
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def timeline_text(screen: RunDetailScreen) -> str:
    return rendered(screen.query_one("#timeline-text", Static))


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


@pytest.mark.parametrize("size", [(60, 20), (44, 20), (80, 24)])
def test_a_narrow_overview_keeps_each_cards_lines_and_the_host_line_whole(size: tuple[int, int]) -> None:
    # Over SSH in a small pane: a long GPU name and a throttle badge must not wrap the header
    # into the next line and push the power line out of the card.
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake, clock=lambda: FROZEN_TS)
        fake.clock = lambda: FROZEN_TS + 90  # the first card at its power cap
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            text = app.query(GpuCard).first().text
            shown = [strip.text for strip in text.render_lines(Region(0, 0, *text.size))]
            assert len(shown) == 3
            assert shown[0].startswith("GPU 0") and "SW_POWER_CAP" in shown[0]
            assert shown[1].startswith("util")
            assert shown[2].startswith("power") and "W (" in shown[2] and "°C" in shown[2]
            host = app.query_one("#host", Static)
            line = "".join(strip.text for strip in host.render_lines(Region(0, 0, *host.size)))
            assert "GiB" in line and (re.search(r"load \d+\.\d\d", line) or size[0] < 60)
            assert "…" not in line and not line.rstrip().endswith("load")  # never a part cut in half

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
            assert [str(r[0]) for r in rows] == [
                "running",
                "queued",
                "failed",
                "stopped",
                "stopped",
                "succeeded",
            ]
            running = rows[0]
            assert "26%" in str(running[3])  # 12 800 of 50 000 samples
            assert str(running[4]) == "14m35s"  # (50 000 − 12 800) / 42.5 samples/s
            assert str(running[6]) == "1"  # retunes
            await pilot.press("enter")
            await wait_workers(pilot)
            screen = app.screen
            assert isinstance(screen, RunDetailScreen) and screen.summary.id == RUNNING
            timeline = timeline_text(screen)
            assert "out of memory in backward (GPU: tried 2.0 GiB, limit 24 GiB, 512 MiB free)" in timeline
            assert "micro-batch 8 → 4, accumulation 4 → 8, effective batch 32 kept" in timeline
            assert "#1" in timeline and "#2" in timeline and "oom" in timeline
            await pilot.press("l")
            log = screen.query_one("#log-view", Log)
            assert log.line_count >= 80 and "step   790" in "\n".join(log.lines)
            await pilot.press("c")
            labels = [text_of(s) for s in screen.query(".chart-label").results(Static)]
            assert any("of 24 GiB" in label and "card's limit" in label for label in labels)
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)

    run(body())


def test_the_run_screen_shows_what_a_retune_does_now_and_each_probes_result() -> None:
    async def body() -> None:
        backend = FakeBackend()
        app = make_app(backend)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            await pilot.press("enter")
            await wait_workers(pilot)
            screen = app.screen
            assert isinstance(screen, RunDetailScreen) and screen.summary.id == RUNNING
            backend.say(RUNNING, "state", "retuning: attempt 2: out of memory", state="retuning")
            backend.say(RUNNING, "probe", "probe 1 of 2: micro-batch 2 × 16 starting", phase="started")
            wanted = "retuning probe 1 of 2: micro-batch 2 × 16 starting"
            await until(pilot, lambda: wanted in timeline_text(screen), "the probe starting")
            backend.say(RUNNING, "probe", "probe 1 of 2: micro-batch 2 running, 3 s", phase="running")
            wanted = "retuning probe 1 of 2: micro-batch 2 running, 3 s"
            await until(pilot, lambda: wanted in timeline_text(screen), "the probe running")
            backend.say(
                RUNNING, "probe", "probe 1 of 2: micro-batch 2 → peak 9.0 GiB, fits (6.2 s)", phase="ended"
            )
            wanted = "retuning probe 1 of 2: micro-batch 2 → peak 9.0 GiB, fits (6.2 s)"
            await until(pilot, lambda: wanted in timeline_text(screen), "the probe's result")
            backend.say(RUNNING, "waiting", "waiting for other processes to free GPU memory: 5 of 30 s")
            wanted = "retuning waiting for other processes to free GPU memory: 5 of 30 s"
            await until(pilot, lambda: wanted in timeline_text(screen), "the retune's wait")
            # A decided retune lists each probe's result under its sentence: attempt 1's here.
            ended = "probe 2 of 2: micro-batch 4 → peak 12 GiB, fits (7.0 s)"
            backend.say(RUNNING, "probe", ended, phase="ended", attempt=1)
            await until(pilot, lambda: "fits (7.0 s)" in timeline_text(screen), "the decided retune's probe")
            text = timeline_text(screen)
            assert text.index("effective batch 32 kept") < text.index("fits (7.0 s)") < text.index("#2 ")

    run(body())


def test_the_log_tab_shows_every_attempt_one_after_another_and_follows_into_the_next() -> None:
    async def body() -> None:
        backend = FakeBackend()
        backend.earlier_logs[(RUNNING, 1, "stdout")] = ["attempt 1 loading the model", "attempt 1 step 0"]
        backend.earlier_logs[(RUNNING, 1, "stderr")] = ["torch.OutOfMemoryError: CUDA out of memory."]
        app = make_app(backend)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            await pilot.press("enter", "l")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen) and screen.summary.id == RUNNING
            log = screen.query_one("#log-view", Log)
            await until(pilot, lambda: "step   790" in "\n".join(log.lines), "attempt 2's output")
            lines = list(log.lines)
            assert lines[:3] == ["── attempt 1 ──", "attempt 1 loading the model", "attempt 1 step 0"]
            assert (
                lines[3] == "── attempt 2: micro-batch 8 → 4, accumulation 4 → 8, effective batch 32 kept ──"
            )
            assert lines[4].startswith("step     0")
            assert "attempt 2" in text_of(screen.query_one("#log-head", Static))
            # The attempt ends and the next one starts: the tab goes on into it.
            backend.next_attempt(RUNNING)
            with backend._lock:
                backend._logs[RUNNING] = ["attempt 3 resumed"]
            await until(pilot, lambda: "attempt 3 resumed" in log.lines, "attempt 3's output")
            assert log.lines[log.lines.index("attempt 3 resumed") - 1] == "── attempt 3 ──"
            assert "show_stream('stderr')" in footer_keys(app)  # the footer offers the other stream
            await pilot.press("o")  # stderr: every attempt's too
            await until(pilot, lambda: "torch.OutOfMemoryError: CUDA out of memory." in log.lines, "stderr")
            assert log.lines[0] == "── attempt 1 ──"
            assert "show_stream('stdout')" in footer_keys(app) and "show_stream('stderr')" not in footer_keys(
                app
            )
            await pilot.press("o")  # and back
            await until(pilot, lambda: "attempt 3 resumed" in log.lines, "stdout again")

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
            text = rendered(screen.query_one("#doctor-text", Static))
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
            deadline = time.monotonic() + SETTLE_S
            table = app.query_one("#runs-table", DataTable)
            while str(table.get_row(RUNNING)[0]) != "stopped":
                assert time.monotonic() < deadline
                await pilot.pause(0.05)
            # Said as it happens: the stop sent, then the run stopped (not "done" when only asked).
            await until(pilot, lambda: "llm-finetune: was stopped" in messages(app), "the stop said")
            said = messages(app)
            assert said.index(
                "llm-finetune: stopping — SIGTERM sent, it checkpoints, then stops"
            ) < said.index("llm-finetune: was stopped")
            assert not any(m.endswith(": done") for m in said)

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
            await pilot.press("2")
            pane = app.main.runs
            await until(pilot, lambda: pane.selected_id() is not None, "the runs table")
            pane.select(STOPPED)
            await pilot.press("t")
            await wait_workers(pilot)
            assert ("tune", STOPPED) in fake.actions
            pane.select(STOPPED)
            await pilot.press("e")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the knob dialog")
            # The dialog names the run's knobs with their values, and its example is one of them.
            dialog = app.screen
            assert "now: batch_size=4, precision=bf16" in text_of(dialog.query_one(".hint", Static))
            assert dialog.query_one(Input).placeholder == "batch_size=8"
            await pilot.press(*"batch_size=2", "enter")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")
            assert ("restart_with", STOPPED, {"infer.batch_size": 2}) in fake.actions
            await wait_workers(pilot)
            pane.select(FAILED)  # the edited run is queued again; the failed one resumes
            await until(pilot, lambda: app.main.check_action("resume_run", ()) is True, "resume offered")
            await pilot.press("r")
            await wait_workers(pilot)
            assert ("resume", FAILED) in fake.actions

    run(body())


def test_a_command_runs_ended_attempts_show_their_peak_resident_memory() -> None:
    async def body() -> None:
        app = make_app(FakeBackend())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            app.main.runs.select(SCRIPT)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            heads = [line for line in timeline_text(screen).splitlines() if line.startswith("#")]
            ended = [line for line in heads if " → now" not in line]
            assert ended and all(line.rstrip().endswith("peak RSS 1.3 GiB") for line in ended), heads
            assert all(len(line.rstrip()) <= 80 for line in heads)

    run(body())


def test_knob_dialog_keeps_the_input_with_what_was_wrong() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            app.main.runs.select(SCRIPT)
            await pilot.press("e")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the knob dialog")
            dialog = app.screen
            error = dialog.query_one("#knob-error", Static)
            await pilot.press(*"batch", "enter")
            assert "name=value" in text_of(error)
            await pilot.press("backspace", "backspace", "backspace", "backspace", "backspace")
            await pilot.press(*"lr=0.1", "enter")
            await until(pilot, lambda: "not a knob" in text_of(error), "the unknown knob named")
            assert "its knobs: batch_size, grad_accum_steps" in text_of(error)
            assert isinstance(app.screen, KnobScreen) and dialog.query_one(Input).value == "lr=0.1"
            fake.refuse_edits = "run my-script: training.batch_size must be at least 1"
            await pilot.press("ctrl+a", "ctrl+k", *"batch_size=0", "enter")
            await until(pilot, lambda: "at least 1" in text_of(error), "the daemon's refusal in the dialog")
            assert dialog.query_one(Input).value == "batch_size=0"  # nothing typed is lost
            await pilot.press("escape")
            assert not [a for a in fake.actions if a[0] == "restart_with" and a[2] != {"batch_size": 0}]

    run(body())


def test_refused_control_says_why_instead_of_acting() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() == RUNNING, "the running run selected")
            await pilot.press("r", "e")  # resume and edit a running run: not offered, say why
            await wait_workers(pilot)
            assert not [a for a in fake.actions if a[0] in ("resume", "restart_with")]
            assert not isinstance(app.screen, KnobScreen)
            shown = messages(app)
            assert "llm-finetune is running: only a failed, stopped or interrupted run resumes" in shown
            assert "llm-finetune is running: stop it first (s), then change it" in shown

    run(body())


def test_submit_lists_the_completions_and_selects_the_new_run(tmp_path: Any) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "finetune.yaml").write_text("name: x\n")
    (tmp_path / "specs" / "fine-lora.yaml").write_text("name: y\n")
    (tmp_path / "spare").mkdir()

    async def body() -> None:
        fake = FakeBackend()
        app = SaidApp(fake, clock=lambda: FROZEN_TS, cwd=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("n")
            assert isinstance(app.screen, SubmitScreen)
            dialog = app.screen
            await pilot.press(*"sp")
            options = dialog.candidates
            shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
            assert shown == ["spare/", "specs/"]  # every match, not only the first
            await pilot.press("down", "tab")  # the second one
            assert dialog.query_one(Input).value == "specs/"
            await pilot.press("f")
            shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
            assert shown == ["specs/fine-lora.yaml", "specs/finetune.yaml"]
            await pilot.press("down", "enter")  # enter on a partial path completes it
            assert dialog.query_one(Input).value == "specs/finetune.yaml"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")
            assert ("submit", str(tmp_path / "specs" / "finetune.yaml")) in fake.actions

            # The new run is listed and has the cursor.
            def new_run_selected() -> bool:
                selected = app.main.runs.selected()
                return selected is not None and selected.name == "finetune"

            await until(pilot, new_run_selected, "the new run selected")
            assert app.main.tab == "runs"

    run(body())


def test_tab_right_after_typing_completes_what_was_typed_not_the_stale_list(tmp_path: Any) -> None:
    # Tab can reach the dialog before the message of the keystroke before it (fast typing, a
    # paste): it must complete what the field holds, not what the list showed a moment ago.
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "finetune.yaml").write_text("name: x\n")
    (tmp_path / "specs" / "serve.yaml").write_text("name: y\n")

    async def body() -> None:
        app = SaidApp(FakeBackend(), clock=lambda: FROZEN_TS, cwd=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("n", *"specs/")
            dialog = app.screen
            assert isinstance(dialog, SubmitScreen)
            field = dialog.query_one(Input)
            field.insert_text_at_cursor("s")  # typed, its message not yet handled …
            await dialog.run_action("accept")  # … when tab arrives
            assert field.value == "specs/serve.yaml"
            await pilot.pause()  # the late message must not undo the completion or the list
            assert field.value == "specs/serve.yaml"
            options = dialog.candidates
            assert [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)] == []

    run(body())


def test_a_refused_spec_stays_in_the_dialog(tmp_path: Any) -> None:
    (tmp_path / "notes.txt").write_text("no spec\n")

    async def body() -> None:
        fake = FakeBackend()
        app = SaidApp(fake, clock=lambda: FROZEN_TS, cwd=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("n", *"notes.txt", "enter")
            dialog = app.screen
            assert isinstance(dialog, SubmitScreen)
            error = dialog.query_one("#submit-error", Static)
            await until(pilot, lambda: "not a YAML run spec" in text_of(error), "the refusal in the dialog")
            assert dialog.query_one(Input).value == "notes.txt"

    run(body())


def test_kill_only_own_stray_processes_after_confirm() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert "kill_process" not in footer_keys(app)  # first row: pid 4242 belongs to a run
            await pilot.press("x")
            assert not isinstance(app.screen, ConfirmScreen)
            assert "process 4242 is run ra1b2c3d4e5: stop the run instead (2, then s)" in messages(app)
            await pilot.press("j", "j", "x")  # pid 6060 is alice's
            assert not isinstance(app.screen, ConfirmScreen)
            assert messages(app)[-1] == "process 6060 belongs to alice: you can only terminate your own"
            await pilot.press("k")  # pid 5151: a stray notebook of ours
            assert "kill_process" in footer_keys(app)
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_workers(pilot)
            assert [a for a in fake.actions if a[0] == "kill"] == [("kill", 5151)]
            await until(pilot, lambda: app.query_one("#processes", DataTable).row_count == 2, "the row gone")

    run(body())


def test_history_is_refetched_when_its_charts_narrow_without_the_pane_resizing() -> None:
    # A scrollbar that comes (here: a gutter kept for it) narrows every chart, not the pane.
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            pane = app.query_one(HistoryPane)
            chart = app.query(HistoryBlock).first().charts[0].chart

            def fetched_at_width() -> bool:
                return (
                    pane._resize_timer is None
                    and not pane._loading
                    and bool(fake.history_calls)
                    and fake.history_calls[-1][4] == 2 * chart.plot_width
                )

            await until(pilot, fetched_at_width, "the history at the charts' width")
            before = fake.history_calls[-1][4]
            size = pane.size
            pane.styles.scrollbar_gutter = "stable"
            await until(pilot, lambda: 2 * chart.plot_width < before, "the charts narrowed")
            await until(pilot, fetched_at_width, "the history refetched at the narrower width")
            assert pane.size == size and fake.history_calls[-1][4] < before

    run(body())


def test_history_windows_metric_and_cursor() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            fake.history_calls.clear()
            await pilot.press("3")
            pane = app.query_one(HistoryPane)
            await until(
                pilot,
                lambda: (
                    pane._resize_timer is None
                    and pane.loaded is not None
                    and not pane.needs_reload
                    and pane.loaded_points == pane._points_wanted()
                ),
                "the history at the width it is shown at",
            )
            await wait_workers(pilot)
            uuids, metrics, start, end, points = fake.history_calls[-1]
            assert uuids == tuple(g.uuid for g in fake.gpus())
            assert (metrics, end - start, end) == (("util_gpu",), 300.0, FROZEN_TS)
            chart = app.query(HistoryBlock).first().charts[0].chart
            assert points == 2 * chart.plot_width  # two points per character cell of the chart
            assert chart.plot_width == 80 - 2 - 8  # the pane less its margins and axis: no scrollbar
            host_metrics, *_ = fake.host_history_calls[-1]
            assert host_metrics == ("cpu_percent", "mem_used", "mem_total")
            await pilot.press("w", "w", "w")
            await wait_workers(pilot)
            assert pane.window == "7d" and pane.loaded == ("7d", ("util_gpu",), ("cpu_percent", "mem_used"))
            assert fake.history_calls[-1][3] - fake.history_calls[-1][2] == 7 * 86_400
            block = app.query(HistoryBlock).first()
            assert "▸ 11-21 02:" in text_of(
                block.title
            )  # the cursor starts at the newest point, with the date
            await pilot.press("home")
            series = block.charts[0]
            assert series.chart.cursor == 0
            assert "▸ 11-14 03:" in text_of(block.title)  # the middle of the first bucket
            assert text_of(series.label).startswith("utilisation") and "%" in text_of(series.label)
            await pilot.press("right", "right")
            assert series.chart.cursor == 2
            await pilot.press("m")
            await wait_workers(pilot)
            assert fake.history_calls[-1][1] == ("mem_used",)
            series = app.query(HistoryBlock).first().charts[0]
            assert "GiB" in text_of(series.label)

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
            # Ticked or not reads without colour: an X in a ticked box only.
            boxes = [app.screen.query_one("#metrics").render_line(y).text[:3] for y in range(3)]
            assert (
                boxes[0].strip("▐▌ ") == "X" and boxes[1].strip("▐▌ ") == "" and boxes[2].strip("▐▌ ") == ""
            )
            # The list starts on utilisation (ticked); tick power (two down) and apply with enter.
            await pilot.press("down", "down", "space", "enter")
            assert isinstance(app.screen, MainScreen)
            await wait_workers(pilot)
            pane = app.query_one(HistoryPane)
            assert pane.metrics == ("util_gpu", "power_w")
            assert pane.loaded == ("5m", ("util_gpu", "power_w"), ("cpu_percent", "mem_used"))
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
            await pilot.press("c")
            assert isinstance(app.screen, MetricsScreen)
            choices = app.screen.query_one(SelectionList)
            assert [str(choices.get_option_at_index(i).prompt) for i in range(choices.option_count)][-4:] == [
                "host CPU", "host memory", "host load (1 min)", "host swap"
            ]  # fmt: skip
            choices.deselect_all()
            await pilot.press("enter")
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


@pytest.mark.parametrize("backend", [FakeBackend, FakeBackend.no_gpu], ids=["two-gpus", "no-gpu"])
def test_history_default_view_at_80x24_shows_every_charts_axis(backend: Callable[[], FakeBackend]) -> None:
    async def body() -> None:
        app = make_app(backend())
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await wait_workers(pilot)
            pane = app.query_one(HistoryPane)
            await until(pilot, lambda: pane._resize_timer is None, "the charts fitted to the pane")
            await pilot.pause()
            bottom = pane.content_region.bottom
            charts = [sc for block in app.query(HistoryBlock) for sc in block.charts]
            assert charts and all(sc.chart.plot_height >= 1 for sc in charts)
            # Each block's last chart carries the time axis: its last line is on screen unscrolled.
            axes = [sc.chart for sc in charts if sc.axis]
            assert axes and all(chart.region.bottom <= bottom for chart in axes), (
                [chart.region for chart in axes],
                pane.content_region,
            )
            assert pane.max_scroll_y == 0
            assert all(chart.render_line(chart.plot_height).text.rstrip().endswith("now") for chart in axes)

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
            assert "Overview" in titles and not any(
                t.startswith(("Stop", "Resume", "Submit")) for t in titles
            )
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)

    run(body())


def test_the_help_says_what_each_short_column_header_of_the_runs_table_holds() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2", "question_mark")
            assert isinstance(app.screen, HelpScreen)
            shown = "\n".join(rendered(s, 100) for s in app.screen.query(Static))
            rows = {line.split()[0]: line for line in shown.splitlines() if line.strip()}
            for header in ("State", "GPU", "ETA", "smp/s", "Rt", "ID"):
                assert header in rows, (header, shown)
            assert "out-of-memory" in rows["Rt"] and "samples" in rows["smp/s"]
            assert "never shortened" in rows["ID"]

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


def test_every_binding_is_in_the_help_table_and_palette_offers_only_gpuwardens_commands() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            documented = {name for a in ACTIONS for name in (a.action.split("(")[0], *a.also)}
            holders: list[Any] = [
                *(app, app.main, RunDetailScreen, HistoryPane, RunsPane, NavTable, Scroller, HostsPane)
            ]
            for holder in holders:
                for binding in holder.BINDINGS:
                    assert binding.action.split("(")[0] in documented, binding
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() == RUNNING, "the runs table")
            titles = {c.title: c.help for c in app.get_system_commands(app.screen)}
            # The selected run is running: stop is offered, resume and edit are not.
            assert "Stop llm-finetune" in titles and "Resume llm-finetune" not in titles
            assert "SIGTERM" in titles["Stop llm-finetune"] and "(s)" in titles["Stop llm-finetune"]
            assert {"Submit a run spec", "Keys", "History window", "Filter runs", "Sort runs"} <= set(titles)
            # Textual's own commands are not gpuwarden's: none is offered.
            assert not {"Theme", "Screenshot", "Maximize", "Show keys and help panel"} & set(titles)
            assert not any("selected run or process" in h for h in titles.values())
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
                fake.clock = clock_at(FROZEN_TS + k)
                app.buffer.put(SampleFrame(fake.snapshot()))
                app.post_message(FramesReady())
            app.buffer.put(RunFrame(fake.runs()[1]))
            app.post_message(FramesReady())
            series = app.live.gpus[uuid].series["util_gpu"]
            expected = min(before + 200, series.maxlen or 0)
            await until(pilot, lambda: len(app.live.gpus[uuid].series["util_gpu"]) == expected, "every frame")
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
            deadline = time.monotonic() + SETTLE_S
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
            assert any("not running" in m for m in messages(app))

    run(body())


def test_command_palette_runs_a_control_on_the_selected_run() -> None:
    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() is not None, "the runs table")
            app.main.runs.select(STOPPED)
            await pilot.press("ctrl+p")
            await pilot.press(*"Tune vlm")
            await until(pilot, lambda: "Tune vlm-batch" in rendered_palette(app), "the command listed")
            await pilot.press("enter")
            await until(pilot, lambda: ("tune", STOPPED) in fake.actions, "the tune asked for")
            await wait_workers(pilot)
            # On a run's screen the palette offers that run's controls and not the process one.
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert "Resume vlm-batch" in titles and "Back to the runs" in titles
            assert not any(t.startswith("Terminate") for t in titles) and "History metrics" not in titles

    run(body())


def test_command_palette_stops_a_run_from_the_history_tab() -> None:
    """ "stop" in the palette finds the running run whatever the tab shows."""

    async def body() -> None:
        fake = FakeBackend()
        app = make_app(fake)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() is not None, "the runs table")
            app.main.runs.select(STOPPED)  # the selection is another run: the palette is not tied to it
            await pilot.press("3", "ctrl+p")
            await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
            await pilot.press(*"Stop")
            await until(pilot, lambda: "Stop llm-finetune" in rendered_palette(app), "the command listed")
            assert "Stop vlm-batch" not in rendered_palette(app)  # a stopped run has nothing to stop
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the stop asked first")
            await pilot.press("y")
            await until(pilot, lambda: ("stop", RUNNING) in fake.actions, "the stop sent")

    run(body())


def rendered_palette(app: GpuwardenApp) -> str:
    from textual.command import CommandList

    lists = list(app.screen.query(CommandList))
    return (
        " ".join(str(lists[0].get_option_at_index(i).prompt) for i in range(lists[0].option_count))
        if lists
        else ""
    )


def test_command_palette_opens_the_history_metrics_from_another_tab() -> None:
    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("ctrl+p")
            await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
            await pilot.press(*"History metrics")
            await until(pilot, lambda: "History metrics" in rendered_palette(app), "the command listed")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, MetricsScreen), "the metrics dialog")
            assert app.screen_stack[0].tab == "history"  # type: ignore[attr-defined]
            await pilot.press("down", "space", "enter")  # add memory
            await wait_workers(pilot)
            assert app.query_one(HistoryPane).loaded == (
                "5m",
                ("util_gpu", "mem_used"),
                ("cpu_percent", "mem_used"),
            )

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
            await until(pilot, lambda: "LOST" in text_of(app.query(GpuCard).last().text), "the lost card")
            lost = app.query(GpuCard).last()
            assert "LOST" in text_of(lost.text) and lost.has_class("lost")
            assert "LOST" not in text_of(app.query(GpuCard).first().text)
            assert app.live.gpus[uuid].series["util_gpu"][-1] is None  # a gap in the chart, not a zero

    run(body())


def test_a_log_with_terminal_escapes_shows_text_and_never_repaints_the_screen() -> None:
    async def body() -> None:
        backend = FakeBackend()
        backend._logs[RUNNING] = [
            "\x1b[31mred\x1b[0m \x1b[2J\x1b[Hcleared \x1b]0;title\x07bell\x07 日本 🚀",
            "10%\r20%\r\n",
        ]
        app = make_app(backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            await pilot.press("enter", "l")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            log = screen.query_one("#log-view", Log)
            await until(pilot, lambda: log.line_count >= 4, "the log")
            shown = ["".join(s.text for s in log.render_line(y)).rstrip() for y in range(6)]
            # Under the lines that open attempt 1 (no output) and attempt 2 (this one); a progress
            # redrawn with carriage returns is the one line the program's terminal showed.
            assert shown[2:5] == ["red cleared bell 日本 🚀", "20%", ""]
            assert not any("\x1b" in line or "\x07" in line for line in shown)

    run(body())


def test_a_log_tail_full_of_redraws_reaches_back_to_what_was_said_before_them() -> None:
    """A Trainer's stderr after a long run: one early warning, then a progress bar redrawn a
    hundred thousand bytes' worth. The last 32 KB hold one line; the tab reads further back."""

    async def body() -> None:
        backend = FakeBackend()
        redraws = "\r".join(f" {i % 100:2d}%|{'█' * (i % 10)}| {i}/20000" for i in range(20_000))
        backend._errs[RUNNING] = ["UserWarning: the tokenizer has no pad token", redraws]
        app = make_app(backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await wait_workers(pilot)
            await pilot.press("enter", "l", "o")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            log = screen.query_one("#log-view", ProgramLog)
            await until(pilot, lambda: any("19999/20000" in line for line in log.lines), "the last redraw")
            assert "UserWarning: the tokenizer has no pad token" in log.lines
            assert sum("/20000" in line for line in log.lines) == 1

    run(body())


def test_the_help_scrolls_with_the_keys_it_lists() -> None:
    """At 80×24 the help is taller than the screen: j/k, g/G move through it as in a table."""

    async def body() -> None:
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            scroll = app.screen.query_one(VerticalScroll)
            await until(pilot, lambda: scroll.max_scroll_y > 0, "the help laid out")
            await pilot.press("j", "j")
            await until(pilot, lambda: scroll.scroll_y == 2, "two lines down")
            await pilot.press("G")
            await until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y, "the end of the help")
            await pilot.press("k")
            await until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y - 1, "one line up")
            await pilot.press("g")
            await until(pilot, lambda: scroll.scroll_y == 0, "the top of the help")

    run(body())


def test_without_a_gpu_the_overview_names_only_the_keys_this_dashboard_has() -> None:
    """The empty list's hint names `n` only where a run can be submitted (not read-only)."""
    lines: list[str] = []

    async def body(controls: bool) -> None:
        app = make_app(FakeBackend(0, with_runs=False, controls=controls))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            empty = app.query_one("#proc-empty", Static)
            await until(pilot, lambda: "no run is working" in rendered(empty), "the empty list's line")
            lines.append(rendered(empty))

    run(body(True))
    run(body(False))
    assert "2 lists every run, n submits one" in lines[0]
    assert "2 lists every run" in lines[1] and "n submits" not in lines[1]
