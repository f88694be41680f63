"""The dashboard app: it holds the live state and the screens, and hands each job to its part —
`LiveStream` reads the daemon in thread workers, `RunControls` asks and runs the controls,
`KeyHold` keeps what is typed while a dialog opens, `palette_commands` fills ctrl+p. Screens and
panes never call the app: they post requests (`gpuwarden.tui.requests`) it answers here.

Data flow: the stream posts `FramesReady` only when none is pending; the app drains the buffer,
folds the frames into `LiveState` and redraws inside `batch_update()`. Every worker's failure
lands in `on_worker_state_changed`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.command import CommandPalette
from textual.message import Message
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from gpuwarden.core.errors import UserError
from gpuwarden.tui.backend import DashboardBackend, HostsSource, SampleFrame, SourceStatus
from gpuwarden.tui.dashboard import control_refusal
from gpuwarden.tui.key_hold import KeyHold
from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.live import FrameBuffer, LiveState
from gpuwarden.tui.messages import Connected, FramesReady, HealthRead, RunsLoaded
from gpuwarden.tui.metrics import CHART_METRICS, METRICS_BY_KEY, next_metric
from gpuwarden.tui.palette import palette_commands
from gpuwarden.tui.requests import (
    AskEdit,
    AskKill,
    AskRerun,
    AskResume,
    AskStop,
    AskSubmit,
    AskTune,
    ChooseMetrics,
    CycleOverviewMetric,
    HistoryWindow,
    MainShown,
    OpenRun,
    OpensDialog,
    ShowTab,
)
from gpuwarden.tui.run_controls import RunControls
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from gpuwarden.tui.session_log import LOG
from gpuwarden.tui.storage_notice import storage_notice
from gpuwarden.tui.stream import LiveStream
from gpuwarden.tui.widgets.status_bar import StatusBar

RUNS_POLL_S = 5.0  # progress and throughput come with the runs list; state changes come live
RECONNECT_S = 2.0
# The daemon's storage health is asked for, not streamed. A frame sent when it changes would need
# the daemon to notice a fault's end by itself (a file's fault ends when a look finds the file
# writable again, which /v1/health does), and a frame dropped for a slow reader would leave the
# warning up, or never raise it, until the next reconnect. One small request every few seconds
# costs nothing and is right again at the next poll whatever happened before.
HEALTH_POLL_S = 3.0
TICK_S = 1.0  # the history's "newest point" age and its slower refresh of long windows


class GpuwardenApp(App[None]):
    CSS_PATH = "gpuwarden.tcss"
    TITLE = "gpuwarden"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_tab('overview')", "Overview", show=False),
        Binding("2", "show_tab('runs')", "Runs", show=False),
        Binding("3", "show_tab('history')", "History", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        backend: DashboardBackend,
        *,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
        cwd: Path | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.readonly = readonly
        self.clock = clock
        self.cwd = cwd  # where relative spec paths are read from (the shell's directory)
        self.live = LiveState()
        self.buffer = FrameBuffer()
        self.status: SourceStatus | None = None
        self.connected = False
        self.overview_metric = CHART_METRICS[0].key
        self.reconnect_s = RECONNECT_S
        self.health_poll_s = HEALTH_POLL_S
        self.redraws = 0  # how many coalesced redraws happened (benchmarks and tests read it)
        self.stream = LiveStream(self, backend, clock, self.buffer)
        self.key_hold = KeyHold(self, super().on_event)
        self.controls = RunControls(self, self, self.key_hold, self.stream.load_runs, self.show_new_run)

    def notify(self, message: str, *, title: str = "", **kwargs: Any) -> None:
        LOG.info("told the user: %s%s", f"[{title}] " if title else "", message)
        super().notify(message, title=title, **kwargs)

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen(self)

    @property
    def main(self) -> MainScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def on_mount(self) -> None:
        # The first connect starts from the main screen's first refresh, once its panes exist.
        self.set_interval(RUNS_POLL_S, self.poll_runs)
        self.set_interval(self.health_poll_s, self.poll_health)
        self.set_interval(TICK_S, self.tick)

    def on_main_shown(self, message: MainShown) -> None:
        self.show_status()
        self.call_after_refresh(self.stream.connect)

    def on_unmount(self) -> None:
        self.stream.stop.set()
        self.backend.close()

    async def action_quit(self) -> None:
        self.stream.stop.set()
        self.exit()

    # -- keys typed while a dialog opens -------------------------------------------------------

    def post_message(self, message: Message) -> bool:
        """A request for a dialog starts keeping the keys as it is posted: the keys typed after the
        one that asked are already queued behind it."""
        if isinstance(message, OpensDialog):
            self.key_hold.start()
        return super().post_message(message)

    async def on_event(self, event: events.Event) -> None:
        if not self.key_hold.take(event):
            await super().on_event(event)

    async def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        await self.key_hold.focused(event.widget)

    # -- the stream ----------------------------------------------------------------------------

    async def on_connected(self, message: Connected) -> None:
        if not self.live_ui:
            return
        LOG.info("connected: %s %s", message.status.source, message.status.location)
        reconnected = self.stream.had_connection and not self.connected
        was = self.status.storage_fault if self.status else None
        self.status = message.status
        self._tell_storage(was)
        if not message.status.controls and not self.readonly:
            self.readonly = True  # a database cannot act: hide the controls rather than fail them
            self.main.runs.readonly = True
            self.main.overview.readonly = True
        await self._load_live(message)
        self.set_connected(True)
        with self.batch_update():
            self._redraw(samples=True, processes=True, runs=True)
        # What the history shows may predate the gap: fetch it again (now if it is on screen).
        main = self.main
        main.history.stale()
        if main.tab == "history":
            main.history.reload()
        if reconnected:
            self.notify("daemon reachable again", title="connection", timeout=3)
        self.stream.had_connection = True

    async def _load_live(self, message: Connected) -> None:
        """The first load into the live state and the panes that are built from it."""
        live = self.live
        live.set_gpus(message.gpus)
        for uuid, by_metric in message.recent.items():
            for metric, values in by_metric.items():
                live.prefill(uuid, metric, values)
        live.set_runs(message.runs)
        live.apply([SampleFrame(message.snapshot)])
        await self.main.overview.set_gpus(live, message.status.sampling)
        await self.main.history.set_gpus(message.gpus, message.status.sampling)

    def set_connected(self, connected: bool) -> None:
        """Live or not: offline, every screen dims its stale data and offers no control."""
        was = self.connected
        self.connected = connected
        for screen in self.screen_stack:
            screen.set_class(not connected and self.status is not None, "-offline")
            if isinstance(screen, RunDetailScreen) and connected and not was:
                screen.back_online()
            elif isinstance(screen, RunDetailScreen):
                screen.show_head()
        self.show_status()
        self.refresh_bindings()

    @property
    def live_ui(self) -> bool:
        """False once shutdown has begun: late worker messages must not touch removed widgets."""
        return self.is_running and bool(self.screen_stack) and not self.stream.stop.is_set()

    def on_frames_ready(self, message: FramesReady) -> None:
        if not self.live_ui:
            return
        frames = self.stream.take_frames()
        if not frames:
            return
        changes = self.live.apply(frames)
        with self.batch_update():
            self._redraw(samples=changes.samples, processes=changes.processes, runs=bool(changes.runs))
            if changes.snapshots:
                self.main.history.add_samples(changes.snapshots, self.clock())
        detail = self.screen if isinstance(self.screen, RunDetailScreen) else None
        if detail is not None:
            touched = changes.runs | {e.run_id for e in changes.events}
            if detail.summary.id in touched:
                detail.run_changed(self.live.runs.get(detail.summary.id, detail.summary))

    def _redraw(self, *, samples: bool, processes: bool, runs: bool) -> None:
        self.redraws += 1
        main = self.main
        if samples or processes or runs:
            main.overview.show(
                self.live,
                METRICS_BY_KEY[self.overview_metric],
                samples=samples,
                processes=processes,
                runs=runs,
            )
        if runs:
            main.runs.show(self.live.runs_sorted())
            self.controls.tell_stopped()
        self.show_status()

    def show_status(self) -> None:
        snap = self.live.snapshot
        for screen in self.screen_stack:
            for bar in screen.query(StatusBar):
                bar.show(
                    self.status,
                    connected=self.connected,
                    last_ts=snap.ts if snap else None,
                    readonly=self.readonly,
                )

    def tick(self) -> None:
        """Once a second: the history's age line, and its refresh when a long window is due."""
        if self.connected and self.screen_stack:
            visible = isinstance(self.screen, MainScreen) and self.main.tab == "history"
            self.main.history.tick(self.clock(), visible)

    def poll_health(self) -> None:
        if self.connected:
            self.stream.read_health()

    def on_health_read(self, message: HealthRead) -> None:
        if not self.live_ui or not self.connected or self.status is None:
            return  # offline, the top line says so instead; the next connect reads health again
        was = self.status.storage_fault
        if message.storage_fault == was:
            return
        self.status = dataclasses.replace(self.status, storage_fault=message.storage_fault)
        self._tell_storage(was)
        self.show_status()
        for screen in self.screen_stack:
            if isinstance(screen, RunDetailScreen):
                screen.show_head()

    def _tell_storage(self, was: str | None) -> None:
        notice = storage_notice(was, self.status.storage_fault if self.status else None)
        if notice is not None:
            self.notify(notice.message, title=notice.title, severity=notice.severity, timeout=notice.timeout)

    def poll_runs(self) -> None:
        if self.connected:
            self.stream.load_runs()

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        if not self.live_ui:
            return
        self.live.set_runs(message.runs)
        self.controls.tell_stopped()
        with self.batch_update():
            self.main.runs.show(self.live.runs_sorted())
            self.main.overview.show_runs(self.live)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures are reported."""
        worker = event.worker
        if event.state == WorkerState.SUCCESS and worker.group == "control":
            self.controls.succeeded(worker)
            self.stream.load_runs()
            self.stream.refresh_snapshot()
            return
        if event.state != WorkerState.ERROR:
            return
        self.controls.failed(worker)
        error = worker.error
        text = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        if worker.group == "stream":
            self._stream_ended(error)
        elif worker.group == "health":
            # The stream tells when the daemon is gone; otherwise the next poll asks again.
            LOG.info("health not read: %s", text)
        else:
            self.notify(text, title=worker.name or worker.group, severity="error", timeout=8)

    def _stream_ended(self, error: BaseException | None) -> None:
        """Offline until the stream connects again, which it tries after `reconnect_s`."""
        was_connected = self.connected
        what = "live stream ended" if was_connected else "could not connect"
        LOG.warning("%s: %s: %s", what, type(error).__name__, error)
        self.set_connected(False)
        if was_connected or not self.stream.had_connection:
            self.notify(self.stream.failure(error), title="connection", severity="warning", timeout=6)
        if not self.stream.stop.is_set():
            self.set_timer(self.reconnect_s, self.stream.connect)

    # -- navigation --------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.main.show_tab(tab)

    def on_show_tab(self, message: ShowTab) -> None:
        self.action_show_tab(message.tab)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.readonly, hosts=isinstance(self.backend, HostsSource)))

    def on_cycle_overview_metric(self, message: CycleOverviewMetric) -> None:
        self.overview_metric = next_metric(self.overview_metric, message.step)
        with self.batch_update():
            self._redraw(samples=True, processes=False, runs=False)

    def on_history_window(self, message: HistoryWindow) -> None:
        self.action_show_tab("history")
        self.main.history.action_cycle_window(message.step)

    def on_choose_metrics(self, message: ChooseMetrics) -> None:
        self.action_show_tab("history")
        self.call_later(self.main.action_choose_metrics)

    def on_open_run(self, message: OpenRun) -> None:
        self.open_run(message.run_id)

    def open_run(self, run_id: str) -> None:
        run = self.live.runs.get(run_id)
        if run is not None:
            screen = RunDetailScreen(self.backend, run, self)
            self.push_screen(screen)
            screen.set_class(not self.connected, "-offline")

    def show_new_run(self, run_id: str) -> None:
        """A run just submitted: the runs tab, with it selected, and the runs read again."""
        self.action_show_tab("runs")
        self.main.runs.select(run_id)
        self.stream.load_runs()

    # -- controls ------------------------------------------------------------------------------

    def control_refusal(self) -> str | None:
        """Why no control can run now (read-only, or no daemon), else None."""
        return control_refusal(self.readonly, self.connected)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in CONTROL_ACTIONS and self.control_refusal() is not None)

    def on_ask_stop(self, message: AskStop) -> None:
        self.controls.ask_stop(message.run)

    def on_ask_resume(self, message: AskResume) -> None:
        self.controls.ask_resume(message.run)

    def on_ask_tune(self, message: AskTune) -> None:
        self.controls.ask_tune(message.run)

    def on_ask_edit(self, message: AskEdit) -> None:
        self.controls.ask_edit(message.run, message.detail)

    def on_ask_rerun(self, message: AskRerun) -> None:
        self.controls.ask_rerun(message.run, message.detail)

    def on_ask_kill(self, message: AskKill) -> None:
        self.controls.ask_kill(message.proc)

    def on_ask_submit(self, message: AskSubmit) -> None:
        self.controls.ask_submit()

    # -- command palette -----------------------------------------------------------------------

    def action_command_palette(self) -> None:
        """Textual's, with the letters typed right after ctrl+p kept for its search field."""
        if self.use_command_palette and not isinstance(self.screen, CommandPalette):
            self.key_hold.start()
            self.push_screen(CommandPalette(id="--command-palette"))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        return palette_commands(self, screen, self.control_refusal() is not None)
