"""The dashboard app. The backend is injected, so tests and benchmarks hand it a fake.

Data flow: one named thread worker ("stream") loads the first state, then reads the backend's live
frames into a `FrameBuffer` and posts a `FramesReady` message only when none is pending. The app
drains the buffer, folds the frames into `LiveState` and redraws inside `batch_update()` — a slow
terminal never falls behind, it just sees fewer, fuller redraws. Every other blocking call (runs,
history, run detail, log, controls) is its own named thread worker; their failures all land in
`on_worker_state_changed`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from gpuwarden.core.errors import UserError
from gpuwarden.tui.backend import (
    DashboardBackend,
    ProcessInfo,
    RunRow,
    SampleFrame,
    SourceStatus,
)
from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.live import SERIES_CAPACITY, FrameBuffer, LiveState
from gpuwarden.tui.messages import Connected, FramesReady, RunsLoaded
from gpuwarden.tui.metrics import CHART_METRICS, METRICS_BY_KEY, next_metric
from gpuwarden.tui.screens.dialogs import ConfirmScreen, KnobScreen, SubmitScreen
from gpuwarden.tui.screens.help import HelpScreen
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from gpuwarden.tui.widgets.status_bar import StatusBar

RUNS_POLL_S = 5.0  # progress and throughput come with the runs list; state changes come live
RECONNECT_S = 2.0


class GpuwardenApp(App[None]):
    CSS_PATH = "gpuwarden.tcss"
    TITLE = "gpuwarden"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_tab('overview')", "Overview", show=False),
        Binding("2", "show_tab('runs')", "Runs", show=False),
        Binding("3", "show_tab('history')", "History", show=False),
        Binding("n", "submit", "Submit"),
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
        self.reconnect_s = RECONNECT_S
        self.redraws = 0  # how many coalesced redraws happened (benchmarks and tests read it)

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

    def on_unmount(self) -> None:
        self._stop.set()
        self.backend.close()

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    # -- the stream --------------------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream", name="stream")
    def connect(self) -> None:
        """Load everything once, then follow the live frames until told to stop."""
        b = self.backend
        status = b.status()
        gpus = b.gpus()
        snapshot = b.snapshot()
        runs = b.runs()
        recent: dict[str, dict[str, list[float | None]]] = {}
        if gpus:
            # Seed the live charts with the last SERIES_CAPACITY seconds at one point a second (the
            # daemon's default tick), so a freshly opened view already shows recent load.
            now = self.clock()
            keys = [m.key for m in CHART_METRICS]
            series = b.history([g.uuid for g in gpus], keys, now - SERIES_CAPACITY, now, SERIES_CAPACITY)
            recent = {
                uuid: {m: [v for _, v in pts] for m, pts in by_metric.items()}
                for uuid, by_metric in series.items()
            }
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
        self.status = message.status
        self.connected = True
        if not message.status.controls and not self.readonly:
            self.readonly = True  # a database cannot act: hide the controls rather than fail them
            self.main.runs.readonly = True
            self.refresh_bindings()
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
        with self.batch_update():
            self._redraw(samples=True, processes=True, runs=True)
        if main.tab == "history":
            main.history.reload()

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
        detail = self.screen if isinstance(self.screen, RunDetailScreen) else None
        if detail is not None:
            touched = changes.runs | {e.run_id for e in changes.events}
            if detail.summary.id in touched:
                detail.run_changed(self.live.runs.get(detail.summary.id, detail.summary))

    def _redraw(self, *, samples: bool, processes: bool, runs: bool) -> None:
        self.redraws += 1
        main = self.main
        if samples or processes:
            main.overview.show(
                self.live, METRICS_BY_KEY[self.overview_metric], samples=samples, processes=processes
            )
        if runs:
            main.runs.show(self.live.runs_sorted())
        self.show_status()

    def show_status(self) -> None:
        snap = self.live.snapshot
        self.main.query_one("#status", StatusBar).show(
            self.status, connected=self.connected, last_ts=snap.ts if snap else None, readonly=self.readonly
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
        with self.batch_update():
            self.main.runs.show(self.live.runs_sorted())

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures are reported."""
        worker = event.worker
        if event.state == WorkerState.SUCCESS and worker.group == "control":
            result = worker.result
            self.notify(
                f"{worker.name}: {result}" if isinstance(result, str) else f"{worker.name}: done", timeout=4
            )
            self._load_runs()
            self._refresh_snapshot()
            return
        if event.state != WorkerState.ERROR:
            return
        error = worker.error
        text = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        if worker.group == "stream":
            was_connected = self.connected
            self.connected = False
            self.show_status()
            if was_connected or self.status is None:
                self.notify(text, title="connection", severity="warning", timeout=6)
            if not self._stop.is_set():
                self.set_timer(self.reconnect_s, self.connect)
            return
        self.notify(text, title=worker.name or worker.group, severity="error", timeout=8)

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
            self.push_screen(HelpScreen(self.readonly))

    def cycle_overview_metric(self, step: int) -> None:
        self.overview_metric = next_metric(self.overview_metric, step)
        with self.batch_update():
            self._redraw(samples=True, processes=False, runs=False)

    def open_run(self, run_id: str) -> None:
        run = self.live.runs.get(run_id)
        if run is not None:
            self.push_screen(RunDetailScreen(self.backend, run))

    # -- controls ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS and self.readonly:
            return False
        # Submitting from a run's screen is hidden to keep its footer to the run's own keys.
        return not (action == "submit" and isinstance(self.screen, RunDetailScreen))

    def control(self, label: str, call: Callable[..., Any], *args: Any) -> None:
        """Run a control in a thread; its result or refusal is reported by the state handler."""
        if self.readonly:
            return
        self.run_worker(partial(call, *args), name=label, group="control", thread=True, exit_on_error=False)

    def ask_stop(self, run: RunRow) -> None:
        if self.readonly:
            return
        if run.state not in ("running", "starting", "retuning", "queued"):
            self.notify(f"{run.name} is {run.state}: nothing to stop", timeout=4)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.control(f"stop {run.name}", self.backend.stop_run, run.id)

        detail = (
            "SIGTERM to its process group: it writes a checkpoint, then is killed after the grace period."
        )
        self.push_screen(ConfirmScreen(f"Stop run {run.name} ({run.id[:8]})?", detail), answered)

    def ask_resume(self, run: RunRow) -> None:
        if self.readonly:
            return
        self.control(f"resume {run.name}", self.backend.resume_run, run.id)

    def ask_tune(self, run: RunRow) -> None:
        if self.readonly:
            return
        self.control(f"tune {run.name}", self.backend.tune, run.id)

    def ask_edit(self, run: RunRow, spec: dict[str, Any] | None) -> None:
        if self.readonly:
            return

        def answered(changes: dict[str, Any] | None) -> None:
            if changes:
                self.control(f"restart {run.name}", self.backend.restart_with, run.id, changes)

        current = ""
        if spec:
            flat = _flatten(spec)
            current = "now: " + ", ".join(f"{k}={v}" for k, v in list(flat.items())[:6])
        self.push_screen(KnobScreen(run.name, current), answered)

    def ask_kill(self, proc: ProcessInfo) -> None:
        if self.readonly:
            return
        if not proc.owned:
            self.notify(
                f"process {proc.pid} belongs to {proc.user}: you can only terminate your own", timeout=5
            )
            return
        if proc.run_id:
            self.notify(
                f"process {proc.pid} is run {proc.run_id}: stop the run instead (2, then s)", timeout=5
            )
            return

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
        if self.readonly:
            return

        def answered(path: str | None) -> None:
            if path:
                self.control("submit", self.backend.submit, path)

        self.push_screen(SubmitScreen(self.cwd or Path.cwd()), answered)

    # -- command palette ---------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Overview", "GPU cards, host and processes (1)", partial(self.action_show_tab, "overview")
        )
        yield SystemCommand("Runs", "The runs table (2)", partial(self.action_show_tab, "runs"))
        yield SystemCommand("History", "Charts over 5m … 30d (3)", partial(self.action_show_tab, "history"))
        yield SystemCommand("Help", "Every key (?)", self.action_help)
        yield SystemCommand(
            "Next metric", "Chart another metric (m)", partial(self._palette_action, "cycle_metric(1)")
        )
        if isinstance(screen, MainScreen):
            yield SystemCommand(
                "History metrics", "Choose the metrics the history tab charts (c)", self._choose_metrics
            )
        if self.readonly:
            return
        yield SystemCommand("Submit a spec", "Queue a run from a spec file (n)", self.action_submit)
        for title, action, key in (
            ("Stop run", "stop_run", "s"),
            ("Resume run", "resume_run", "r"),
            ("Change a knob and restart", "edit_run", "e"),
            ("Tune run", "tune_run", "t"),
            ("Terminate GPU process", "kill_process", "k"),
        ):
            if hasattr(screen, f"action_{action}") and screen.check_action(action, ()):
                yield SystemCommand(
                    title,
                    f"The selected run or process ({key})",
                    partial(self._palette_action, action, screen),
                )

    def _choose_metrics(self) -> None:
        self.main.show_tab("history")
        self.call_later(self.main.action_choose_metrics)

    def _palette_action(self, action: str, screen: Screen[Any] | None = None) -> None:
        self.call_later(self.run_action, action, screen or self.screen)


def _flatten(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"batch_size": 4}} → {"train.batch_size": 4}: how the knob dialog names keys."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
