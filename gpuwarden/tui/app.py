"""The dashboard app. The backend is injected, so tests and benchmarks hand it a fake.

Data flow: one named thread worker ("stream") loads the first state, then reads the backend's live
frames into a `FrameBuffer` and posts a `FramesReady` message only when none is pending. The app
drains the buffer, folds the frames into `LiveState` and redraws inside `batch_update()` — a slow
terminal never falls behind, it just sees fewer, fuller redraws. Every other blocking call (runs,
history, run detail, log, controls) is its own named thread worker; their failures all land in
`on_worker_state_changed`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import events, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.command import CommandPalette
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from gpuwarden.core.errors import UserError
from gpuwarden.tui.backend import (
    DashboardBackend,
    HistorySeries,
    HostsSource,
    ProcessInfo,
    RunDetailView,
    RunRow,
    SampleFrame,
    SourceStatus,
)
from gpuwarden.tui.controls import OFFLINE, PendingStops
from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.knobs import current_knobs, knob_changes
from gpuwarden.tui.live import SERIES_CAPACITY, FrameBuffer, LiveState
from gpuwarden.tui.messages import Connected, FramesReady, HealthRead, RunsLoaded
from gpuwarden.tui.metrics import CHART_METRICS, METRICS_BY_KEY, next_metric
from gpuwarden.tui.palette import palette_commands
from gpuwarden.tui.screens.dialogs import ConfirmScreen, KnobScreen, SubmitScreen
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from gpuwarden.tui.session_log import LOG
from gpuwarden.tui.widgets.status_bar import StatusBar

RUNS_POLL_S = 5.0  # progress and throughput come with the runs list; state changes come live
RECONNECT_S = 2.0
# The daemon's storage health is asked for, not streamed. A frame sent when it changes would need
# the daemon to notice a fault's end by itself (a file's fault ends when a look finds the file
# writable again, which /v1/health does), and a frame dropped for a slow reader would leave the
# warning up, or never raise it, until the next reconnect. One small request every few seconds
# costs nothing and is right again at the next poll whatever happened before.
HEALTH_POLL_S = 3.0
# Failures that mean the daemon is not there (or stopped answering) rather than a fault.
UNREACHABLE = frozenset({"not_running", "transport", "timeout"})
TICK_S = 1.0  # the history's "newest point" age and its slower refresh of long windows
# Keys held for a dialog that never takes focus are let go after this, so no fault can leave the
# keyboard dead; a dialog normally has focus within a frame or two.
HOLD_S = 5.0


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
        self._stop = threading.Event()
        self._ready_posted = threading.Event()
        self._on_done: dict[Worker[Any], Callable[[Any], None]] = {}
        self._stops = PendingStops()
        self._on_failed: dict[Worker[Any], Callable[[], None]] = {}
        self.reconnect_s = RECONNECT_S
        self.health_poll_s = HEALTH_POLL_S
        self.redraws = 0  # how many coalesced redraws happened (benchmarks and tests read it)
        self._held: list[events.Key] | None = None  # keys read while a dialog opens
        self._held_under: Screen[Any] | None = None  # the screen on top when the hold began
        self._hold_timer: Timer | None = None

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

    def on_unmount(self) -> None:
        self._stop.set()
        self.backend.close()

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    # -- keys typed while a dialog opens -------------------------------------------------------

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded and self._held is not None:
            self._held.append(event)
            return
        await super().on_event(event)

    def hold_keys(self) -> None:
        """Keep the keys read from now on for the dialog about to open. A fast typist or a paste
        sends `n` and a spec's path in one read: without this, the letters after `n` reach the
        main screen before the dialog has focus (`s` offers to stop a run, `q` quits)."""
        if self._held is None:
            self._held = []
            self._held_under = self.screen
            self._hold_timer = self.set_timer(HOLD_S, self._hold_expired)

    async def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if (
            self._held is not None
            and self.screen is not self._held_under
            and event.widget.screen is self.screen
        ):
            await self._release_keys(replay=True)

    async def _hold_expired(self) -> None:
        await self._release_keys(replay=self.screen is not self._held_under)

    def drop_held_keys(self) -> None:
        """The dialog will not open (its data could not be read): what was typed for it is dropped
        rather than acting on the screen below."""
        if self._held:
            LOG.info("dropped %d keys typed for a dialog that did not open", len(self._held))
        self._stop_holding()

    def _stop_holding(self) -> list[events.Key]:
        held = self._held or []
        self._held, self._held_under = None, None
        if self._hold_timer is not None:
            self._hold_timer.stop()
            self._hold_timer = None
        return held

    async def _release_keys(self, *, replay: bool) -> None:
        """The held keys, in the order typed, as if read now (so into the dialog's focused input)."""
        held = self._stop_holding()
        for index, key in enumerate(held if replay else []):
            if self._held is not None:  # a key replayed opened another dialog: the rest are for it
                self._held.extend(held[index:])
                return
            await super().on_event(key)

    # -- the stream --------------------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream", name="stream")
    def connect(self) -> None:
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
        self.post_message(Connected(status, gpus, snapshot, runs, recent))
        for frame in b.frames(self._stop):
            self.buffer.put(frame)
            if not self._ready_posted.is_set():
                self._ready_posted.set()
                self.post_message(FramesReady())
        if not self._stop.is_set():
            raise ConnectionError("the daemon closed the stream")

    async def on_connected(self, message: Connected) -> None:
        if not self.live_ui:
            return
        LOG.info("connected: %s %s", message.status.source, message.status.location)
        reconnected = self._had_connection and not self.connected
        was = self.status.storage_fault if self.status else None
        self.status = message.status
        self._tell_storage(was)
        if not message.status.controls and not self.readonly:
            self.readonly = True  # a database cannot act: hide the controls rather than fail them
            self.main.runs.readonly = True
            self.main.overview.readonly = True
        live = self.live
        live.set_gpus(message.gpus)
        for uuid, by_metric in message.recent.items():
            for metric, values in by_metric.items():
                live.prefill(uuid, metric, values)
        live.set_runs(message.runs)
        live.apply([SampleFrame(message.snapshot)])
        main = self.main
        await main.overview.set_gpus(live, message.status.sampling)
        await main.history.set_gpus(message.gpus, message.status.sampling)
        self.set_connected(True)
        with self.batch_update():
            self._redraw(samples=True, processes=True, runs=True)
        # What the history shows may predate the gap: fetch it again (now if it is on screen).
        main.history.stale()
        if main.tab == "history":
            main.history.reload()
        if reconnected:
            self.notify("daemon reachable again", title="connection", timeout=3)
        self._had_connection = True

    _had_connection = False

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
        return self.is_running and bool(self.screen_stack) and not self._stop.is_set()

    def on_frames_ready(self, message: FramesReady) -> None:
        if not self.live_ui:
            return
        self._ready_posted.clear()
        frames = self.buffer.drain()
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
            self._tell_stopped()
        self.show_status()

    def _stop_sent(self, run: RunRow) -> None:
        self.notify(self._stops.asked(run), timeout=4)
        self._tell_stopped()  # its stopped state may have come first

    def _tell_stopped(self) -> None:
        for line in self._stops.ended(self.live.runs):
            self.notify(line, timeout=4)

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
            self._read_health()

    @work(thread=True, exclusive=True, exit_on_error=False, group="health", name="health")
    def _read_health(self) -> None:
        self.post_message(HealthRead(self.backend.storage_fault()))

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
        """A toast with the whole fault when it starts (the top line keeps a cut one while it
        lasts), and one when it is over."""
        fault = self.status.storage_fault if self.status else None
        if fault == was:
            return
        if fault is None:
            LOG.info("the daemon can write its store again")
            self.notify("the daemon can write its store again", title="storage", timeout=5)
            return
        LOG.warning("the daemon reports: %s", fault)
        self.notify(
            f"{fault}\nRuns go on; new runs wait and samples may be dropped until it is fixed.",
            title="the daemon cannot write its store",
            severity="warning",
            timeout=15,
        )

    def poll_runs(self) -> None:
        if self.connected:
            self._load_runs()

    @work(thread=True, exclusive=True, exit_on_error=False, group="runs", name="runs")
    def _load_runs(self) -> None:
        self.post_message(RunsLoaded(self.backend.runs()))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        if not self.live_ui:
            return
        self.live.set_runs(message.runs)
        self._tell_stopped()
        with self.batch_update():
            self.main.runs.show(self.live.runs_sorted())
            self.main.overview.show_runs(self.live)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures are reported."""
        worker = event.worker
        if event.state == WorkerState.SUCCESS and worker.group == "control":
            self._on_failed.pop(worker, None)
            done = self._on_done.pop(worker, None)
            if done is not None:
                done(worker.result)
            else:
                self.notify(f"{worker.name}: done", timeout=4)
            self._load_runs()
            self._refresh_snapshot()
            return
        if event.state != WorkerState.ERROR:
            return
        self._on_done.pop(worker, None)
        if (failed := self._on_failed.pop(worker, None)) is not None:
            failed()
        error = worker.error
        text = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        if worker.group == "stream":
            was_connected = self.connected
            what = "live stream ended" if was_connected else "could not connect"
            LOG.warning("%s: %s: %s", what, type(error).__name__, error)
            self.set_connected(False)
            if was_connected or not self._had_connection:
                why = self._stream_failure(error, text)
                self.notify(why, title="connection", severity="warning", timeout=6)
            if not self._stop.is_set():
                self.set_timer(self.reconnect_s, self.connect)
            return
        if worker.group == "health":
            # The stream tells when the daemon is gone; otherwise the next poll asks again.
            LOG.info("health not read: %s", text)
            return
        self.notify(text, title=worker.name or worker.group, severity="error", timeout=8)

    def _stream_failure(self, error: BaseException | None, text: str) -> str:
        """What the toast says when the live stream ends: the first failure may say more (not
        running, a version the dashboard refuses); later, a daemon that went away is the usual
        reason, and anything else is named so it is not mistaken for one."""
        if isinstance(error, UserError) and not self._had_connection:
            return text
        if isinstance(error, ConnectionError) or (isinstance(error, UserError) and error.code in UNREACHABLE):
            return OFFLINE
        return f"live stream stopped: {text} — reconnecting"

    @work(thread=True, exclusive=True, exit_on_error=False, group="snapshot", name="snapshot")
    def _refresh_snapshot(self) -> None:
        self.buffer.put(SampleFrame(self.backend.snapshot()))
        if not self._ready_posted.is_set():
            self._ready_posted.set()
            self.post_message(FramesReady())

    # -- navigation --------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.main.show_tab(tab)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.readonly, hosts=isinstance(self.backend, HostsSource)))

    def cycle_overview_metric(self, step: int) -> None:
        self.overview_metric = next_metric(self.overview_metric, step)
        with self.batch_update():
            self._redraw(samples=True, processes=False, runs=False)

    def history_window(self, step: int) -> None:
        self.action_show_tab("history")
        self.main.history.action_cycle_window(step)

    def choose_metrics(self) -> None:
        self.action_show_tab("history")
        self.call_later(self.main.action_choose_metrics)

    def open_run(self, run_id: str) -> None:
        run = self.live.runs.get(run_id)
        if run is not None:
            screen = RunDetailScreen(self.backend, run)
            self.push_screen(screen)
            screen.set_class(not self.connected, "-offline")

    # -- controls ----------------------------------------------------------------------------

    def control_refusal(self) -> str | None:
        """Why no control can run now (read-only, or no daemon), else None."""
        if self.readonly:
            return "read-only: this dashboard shows, it does not act (start it without --readonly or --db)"
        if not self.connected:
            return OFFLINE
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in CONTROL_ACTIONS and self.control_refusal() is not None)

    def control(
        self,
        label: str,
        call: Callable[..., Any],
        *args: Any,
        done: Callable[[Any], None] | None = None,
        failed: Callable[[], None] | None = None,
    ) -> None:
        """Run a control in a thread; its result or refusal is reported by the state handler."""
        if self.control_refusal() is not None:
            if failed is not None:
                failed()
            return
        worker = self.run_worker(
            partial(call, *args), name=label, group="control", thread=True, exit_on_error=False
        )
        if done is not None:
            self._on_done[worker] = done
        if failed is not None:
            self._on_failed[worker] = failed

    def ask_stop(self, run: RunRow) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.control(
                    f"stop {run.name}",
                    self.backend.stop_run,
                    run.id,
                    done=lambda _: self._stop_sent(run),
                )

        detail = (
            "SIGTERM to its process group: it writes a checkpoint, then is killed after the grace period."
            if run.state != "queued"
            else "It leaves the queue before it starts."
        )
        self.push_screen(ConfirmScreen(f"Stop run {run.name} ({run.id})?", detail), answered)

    def ask_resume(self, run: RunRow) -> None:
        self.control(
            f"resume {run.name}",
            self.backend.resume_run,
            run.id,
            done=lambda _: self.notify(f"{run.name}: queued again, it resumes from its last checkpoint"),
        )

    def ask_tune(self, run: RunRow) -> None:
        self.control(
            f"tune {run.name}",
            self.backend.tune,
            run.id,
            done=lambda _: self.notify(f"{run.name}: queued to probe the fastest micro-batch, then go on"),
        )

    def ask_edit(self, run: RunRow, detail: RunDetailView | None = None) -> None:
        """The knob dialog, with the run's knobs and their values (read first if not at hand)."""
        self.hold_keys()  # what is typed while the run is read goes into the dialog
        if detail is not None:
            self._edit_dialog(run, detail.spec)
            return
        self.control(
            f"read {run.name}",
            self.backend.run_detail,
            run.id,
            done=lambda d: self._edit_dialog(run, d.spec),
            failed=self.drop_held_keys,
        )

    def _edit_dialog(self, run: RunRow, spec: dict[str, Any]) -> None:
        knobs = current_knobs(run.kind, spec)

        def apply(typed: dict[str, Any]) -> None:
            """Runs in the dialog's thread: a refusal stays in the dialog with what was typed."""
            self.backend.restart_with(run.id, knob_changes(run.kind, typed, knobs))

        def answered(changes: dict[str, Any] | None) -> None:
            if changes:
                shown = ", ".join(f"{k}={v}" for k, v in changes.items())
                self.notify(f"{run.name}: {shown}; it starts again with them")
                self._load_runs()

        self.push_screen(KnobScreen(run.name, knobs, apply), answered)

    def ask_kill(self, proc: ProcessInfo) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.control(f"terminate {proc.pid}", self.backend.kill_process, proc.pid)

        self.push_screen(
            ConfirmScreen(
                f"Terminate process {proc.pid}?", f"{proc.command}\nSIGTERM, then SIGKILL if it stays."
            ),
            answered,
        )

    def action_submit(self) -> None:
        if self.control_refusal() is not None:
            return

        def answered(run_id: str | None) -> None:
            if run_id:
                self.notify(f"submitted {run_id}", timeout=4)
                self.action_show_tab("runs")
                self.main.runs.select(run_id)
                self._load_runs()

        self.hold_keys()
        cwd = self.cwd or Path.cwd()
        fleet = self.backend if isinstance(self.backend, HostsSource) else None
        if fleet is not None and len(fleet.host_names) > 1:
            dialog = SubmitScreen(cwd, hosts=fleet.host_names, submit_to=fleet.submit_to)
        else:
            dialog = SubmitScreen(cwd, self.backend.submit)
        self.push_screen(dialog, answered)

    # -- command palette ---------------------------------------------------------------------

    def action_command_palette(self) -> None:
        """Textual's, with the letters typed right after ctrl+p kept for its search field."""
        if self.use_command_palette and not isinstance(self.screen, CommandPalette):
            self.hold_keys()
            self.push_screen(CommandPalette(id="--command-palette"))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        return palette_commands(self, screen)
