"""One run: its attempts (each with the settings it was handed and what changed in its config
file) and retunes (one sentence each, the raw evidence one key away), charts of loss, throughput
and peak memory with axes and the card's limit, the log of every attempt (the end of each, one
after another under a line that opens it; the newest followed), and doctor's findings."""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Literal

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from gpuwarden.core.api import Attempt, LogChunk, Retune, RunMetric
from gpuwarden.core.attempt_heading import attempt_heading
from gpuwarden.core.command.record import summary_lines
from gpuwarden.core.oom.explain import retune_sentence
from gpuwarden.core.oom.roles import world_size_of
from gpuwarden.core.units import compact, duration, named, num, size
from gpuwarden.tui.backend import DashboardBackend, DoctorFinding, RunDetailView, RunRow
from gpuwarden.tui.controls import CONTROL_KEYS, OFFLINE, RUN_CONTROLS, refusal, rerun_in_footer
from gpuwarden.tui.dashboard import Dashboard
from gpuwarden.tui.formatting import clock, eta_seconds, evidence_lines, progress_fraction
from gpuwarden.tui.messages import DetailLoaded, DoctorLoaded, LogLoaded
from gpuwarden.tui.requests import AskEdit, AskRerun, AskResume, AskStop, AskTune
from gpuwarden.tui.screens.runs import state_text
from gpuwarden.tui.widgets.chart import Chart
from gpuwarden.tui.widgets.program_log import ProgramLog
from gpuwarden.tui.widgets.rank_table import RankTable
from gpuwarden.tui.widgets.status_bar import storage_warning

LOG_TAIL_BYTES = 32_768  # what the log tab shows first: enough for a screenful many times over
# ... unless a progress bar redrawn in place fills it (it shows as one line): then it reaches
# further back, for at least this many lines, up to this many bytes.
LOG_TAIL_LINES = 200
LOG_TAIL_MAX_BYTES = 1 << 20
LOG_POLL_S = 1.0
EVENTS_SHOWN = 200  # the newest events in the timeline (`gpuwarden events RUN` has them all)
INDENT = 5
Stream = Literal["stdout", "stderr"]
_KEY_ACTION = {key: action for action, key in CONTROL_KEYS.items() if action in RUN_CONTROLS}


def _indented(text: RenderableType, cells: int = INDENT) -> Padding:
    """A paragraph whose wrapped lines keep the indent (never wrapped to column 1)."""
    return Padding(text, (0, 0, 0, cells))


def report_text(report: dict[str, Any] | None) -> Text | None:
    """The report's headline figures in a person's units; energy per sample whatever it is called."""
    if not report:
        return None
    parts: list[str] = []
    for key, label in (("samples_seen", "samples"), ("steps", "steps"), ("wall_s", "in")):
        if isinstance(report.get(key), int | float):
            value = duration(report[key]) if key == "wall_s" else compact(report[key])
            parts.append(f"{value} {label}" if label != "in" else f"in {value}")
    if isinstance(report.get("samples_per_s"), int | float):
        parts.append(f"{report['samples_per_s']:.3g} samples/s")
    if isinstance(report.get("mem_peak"), int | float):
        parts.append(f"peak {size(report['mem_peak'])}")
    for key, value in report.items():
        lowered = key.lower()
        if isinstance(value, int | float) and ("joule" in lowered or "kwh" in lowered or key.endswith("_j")):
            parts.append(_energy_part(key, value))
    if not parts:
        return None
    text = Text("report  ", style="bold")
    text.append(" · ".join(parts))
    return text


def _energy_part(key: str, value: float) -> str:
    lowered = key.lower()
    if "per_sample" in lowered and ("joule" in lowered or lowered.endswith("_j")):
        return f"{value:.3g} J/sample"
    if "per_kwh" in lowered:
        return f"{value:.3g} samples/kWh" if "sample" in lowered else f"{value:.3g} per kWh"
    return f"{key} {named(key, value)}"


def attempt_lines(a: Attempt, detail: RunDetailView) -> list[RenderableType]:
    """An attempt's head line, its reason, and (command runs) the settings it was handed."""
    head = Text()
    head.append(f"#{a.attempt:<3}", style="bold")
    end = clock(a.ended_at) if a.ended_at else "now"
    head.append(f"{clock(a.started_at)} → {end}  ")
    if a.started_at:
        head.append(f"({duration(a.ended_at - a.started_at) if a.ended_at else a.state})  ")
    outcome = a.classification or a.state
    head.append(outcome, style="bold red" if outcome in ("oom", "failed") else "bold green")
    gpus = [detail.gpu_index[u] for u in a.gpus if u in detail.gpu_index]
    head.append(f"  GPU {','.join(map(str, gpus))}" if gpus else "  CPU", style="dim")
    if a.exit_code is not None:
        head.append(f"  exit {a.exit_code}", style="dim")
    if a.peak_rss:
        head.append(f"  peak RSS {size(a.peak_rss)}", style="dim")
    out: list[RenderableType] = [head]
    if a.reason and a.reason != f"exit code {a.exit_code}":
        out.append(_indented(Text(a.reason, style="italic")))
    if a.prepared is not None:
        knobs = ", ".join(f"{k}={v}" for k, v in a.prepared.knobs.items())
        if knobs:
            out.append(_indented(Text(f"knobs {knobs}", style="dim")))
        for line in summary_lines(a.prepared, a.resumed_from):
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            if line.startswith(("+++", "---", "@@")):
                style = "dim"
            out.append(_indented(Text(line, style=style)))
    if a.resume_warning:
        out.append(_indented(Text(a.resume_warning, style="yellow")))
    return out


def timeline_renderable(detail: RunDetailView, raw: bool) -> Group:
    """Attempts in order, each followed by the retune that ended it, then the events."""
    parts: list[RenderableType] = []
    report = report_text(detail.report)
    if report is not None:
        parts += [report, Text()]
    if not detail.attempts:
        parts.append(Text("No attempt yet: the run waits in the queue.", style="dim"))
    by_attempt: dict[int, list[Retune]] = {}
    for rt in detail.retunes:
        by_attempt.setdefault(rt.attempt, []).append(rt)
    for a in detail.attempts:
        parts += attempt_lines(a, detail)
        for rt in by_attempt.get(a.attempt, []):
            parts += retune_lines(rt, detail.oom_phases.get(rt.attempt), raw, world_size_of(detail.spec))
            parts += [
                _indented(Text(text, style="dim")) for text in probe_texts(detail, a.attempt, ("ended",))
            ]
        if a is detail.attempts[-1] and detail.run.state == "retuning" and a.attempt not in by_attempt:
            parts += retuning_lines(detail, a.attempt)
    if detail.retunes and not raw:
        parts.append(Text("v shows each retune's raw evidence", style="dim"))
    if detail.events:
        parts += [Text("\nEvents", style="bold"), _indented(events_grid(detail), 2)]
    return Group(*parts)


def probe_texts(detail: RunDetailView, attempt: int, phases: tuple[str, ...]) -> list[str]:
    """What the probes of the retune after `attempt` said, in the phases asked for."""
    return [e.text for e in detail.events if e.type == "probe" and e.attempt == attempt and e.phase in phases]


def retuning_lines(detail: RunDetailView, attempt: int) -> list[RenderableType]:
    """While the retune after `attempt` decides: what it does now (its probe, or what it waits for)."""
    head = Text("retuning ", style="bold magenta")
    said = [
        e.text
        for e in detail.events
        if e.attempt == attempt and (e.type == "waiting" or (e.type == "probe" and e.phase is not None))
    ]
    latest = said[-1:]
    head.append(latest[0] if latest else "deciding how to restart")
    return [_indented(head, 3)]


def retune_lines(rt: Retune, oom_phase: str | None, raw: bool, world_size: int = 1) -> list[RenderableType]:
    """A retune under the attempt it ended: when, how it went, why in a sentence (raw: the evidence)."""
    head = Text("retune ", style="bold magenta")
    head.append(f"at {clock(rt.ts)}")
    if rt.outcome:
        head.append("  then ", style="dim")
        head.append(rt.outcome, style="green" if rt.outcome == "succeeded" else "yellow")
    out: list[RenderableType] = [
        _indented(head, 3),
        _indented(Text(retune_sentence(rt, oom_phase, world_size))),
    ]
    if raw and rt.evidence:
        shown = {"evidence": rt.evidence, "prediction": rt.prediction}
        out.append(_indented(Text("\n".join(evidence_lines(shown)), style="dim")))
    return out


def events_grid(detail: RunDetailView) -> Table:
    """The newest events, GPUs named as elsewhere on the dashboard."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for e in detail.events[-EVENTS_SHOWN:]:
        kind = Text(e.type, style="magenta" if e.type in ("oom", "error") else "cyan")
        grid.add_row(clock(e.ts), kind, _gpu_names(e.text, detail.gpu_index))
    return grid


def _gpu_names(text: str, gpu_index: dict[str, int]) -> str:
    """GPU UUIDs in a message as the dashboard names GPUs elsewhere (GPU 0)."""
    for uuid, index in gpu_index.items():
        text = text.replace(uuid, f"GPU {index}")
    return text


class Scroller(VerticalScroll, can_focus=True):
    """A tab's scrolling body: j/k and the arrows scroll it, g/G to either end."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "scroll_down", show=False),
        Binding("k", "scroll_up", show=False),
        Binding("g", "scroll_home", show=False),
        Binding("G", "scroll_end", show=False),
    ]

    @property
    def at_end(self) -> bool:
        return self.scroll_y >= self.max_scroll_y - 1


class RunDetailScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("s", "stop_run", "Stop"),
        Binding("r", "resume_run", "Resume"),
        Binding("e", "edit_run", "Edit", priority=True),  # before the keys after it: see hold_keys
        Binding("t", "tune_run", "Tune"),
        # Priority: it opens a dialog, as `e` does. Shown for a run with nothing else to offer
        # (see `rerun_in_footer`), unshown otherwise.
        Binding("R", "rerun_run(1)", "Again", priority=True),
        Binding("R", "rerun_run(0)", show=False, priority=True),
        Binding("v", "toggle_evidence", "Evidence"),
        # One key, two bindings: the footer names the stream `o` switches to (the one not shown).
        Binding("o", "show_stream('stderr')", "Stderr"),
        Binding("o", "show_stream('stdout')", "Stdout"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("a", "detail_tab('timeline')", "Timeline", show=False),
        Binding("c", "detail_tab('charts')", "Charts", show=False),
        Binding("l", "detail_tab('log')", "Log", show=False),
        Binding("d", "detail_tab('doctor')", "Doctor", show=False),
    ]
    DEFAULT_CSS = """
    RunDetailScreen #run-head { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    RunDetailScreen #detail-tabs { height: 1fr; }
    RunDetailScreen TabPane { height: 1fr; padding: 0; overflow: hidden; }
    RunDetailScreen Scroller { height: 1fr; }
    RunDetailScreen #timeline-text { padding: 0 1; }
    RunDetailScreen .chart-label { height: 1; padding: 0 1; }
    RunDetailScreen #charts-empty { padding: 1 1; color: $text-muted; display: none; }
    RunDetailScreen .chart-box Chart { height: 4; margin: 0 1 1 1; }
    RunDetailScreen #log-head { height: 1; padding: 0 1; color: $text-muted; }
    RunDetailScreen Log { height: 1fr; }
    RunDetailScreen.-offline #detail-tabs { text-opacity: 55%; }
    """

    def __init__(self, backend: DashboardBackend, run: RunRow, dashboard: Dashboard) -> None:
        super().__init__()
        self.backend = backend
        self.gw = dashboard
        self.summary = run
        self.detail: RunDetailView | None = None
        self.follow = True
        self.raw_evidence = False
        self.stream: Stream = "stdout"
        self.log_offset = -LOG_TAIL_BYTES
        self.log_attempt = 0  # the attempt whose log is followed (0: none read yet)
        self._log_seen = False  # a chunk of the current stream has been shown
        self._switched = False  # stdout was empty and stderr was shown instead (once)
        self._timeline_shown = False
        self._stop_log = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="run-head")
        with TabbedContent(initial="timeline", id="detail-tabs"):
            with TabPane("Timeline", id="timeline"), Scroller(id="timeline-scroll"):
                yield RankTable()
                yield Static(id="timeline-text")
            with TabPane("Charts", id="charts"), Scroller(id="charts-scroll"):
                yield Static(
                    "No progress reported yet: the charts fill as the run reports its steps (a script "
                    "reports them with gpuwarden.sdk or the Trainer and Lightning callbacks).",
                    id="charts-empty",
                )
                for key, style in (("loss", "yellow"), ("throughput", "cyan"), ("memory", "magenta")):
                    with Vertical(id=f"chart-{key}", classes="chart-box"):
                        yield Static(classes="chart-label")
                        yield Chart(height=4, style=style, fit=True, y_gutter=9, axis=True)
            with TabPane("Log", id="log"):
                yield Static(id="log-head")
                yield ProgramLog(max_lines=5000, id="log-view")
            with TabPane("Doctor", id="doctor"), Scroller(id="doctor-scroll"):
                yield Static("(press d to diagnose this run)", id="doctor-text")
        yield Footer(compact=True)  # at 80 columns the most keys offered at once fit only so

    def on_mount(self) -> None:
        self.show_head()
        self.reload()
        self._tail_log()
        self.query_one("#timeline-scroll", Scroller).focus()

    def on_unmount(self) -> None:
        self._stop_log.set()

    def on_resize(self) -> None:
        self.show_head()  # its warning line is cut to the width

    # -- data -------------------------------------------------------------------------------

    def reload(self) -> None:
        self._load_detail(self.summary.id)

    @work(thread=True, exclusive=True, exit_on_error=False, group="detail")
    def _load_detail(self, run_id: str) -> None:
        self.post_message(DetailLoaded(self.backend.run_detail(run_id)))

    @work(thread=True, exclusive=True, exit_on_error=False, group="doctor")
    def _load_doctor(self, run_id: str) -> None:
        self.post_message(DoctorLoaded(run_id, self.backend.doctor(run_id)))

    def on_doctor_loaded(self, message: DoctorLoaded) -> None:
        self.query_one("#doctor-text", Static).update(doctor_text(message.findings))

    @work(thread=True, exclusive=True, exit_on_error=False, group="log")
    def _tail_log(self) -> None:
        """Every attempt's log so far, then what comes (a next attempt's from its start), every
        second while following."""
        number, offset, stream = self.log_attempt, self.log_offset, self.stream
        me = get_current_worker()  # a newer tail (exclusive) cancels this one
        while not self._stop_log.is_set() and stream == self.stream and not me.is_cancelled:
            if number == 0:
                number, offset = self._catch_up(stream)
            else:
                number, offset = self._read_on(stream, number, offset)
            if not self.follow:
                return
            self._stop_log.wait(LOG_POLL_S)

    def _catch_up(self, stream: Stream) -> tuple[int, int]:
        """The end of each attempt's log, oldest first, each under its heading where there are
        several; (the newest attempt, where its log goes on)."""
        run_id = self.summary.id
        newest = self._tail(stream)
        if newest.attempt <= 1:
            self.post_message(LogLoaded(run_id, newest))
            return newest.attempt, newest.next_offset if newest.attempt else -LOG_TAIL_BYTES
        detail = self.backend.run_detail(run_id)
        for a in detail.attempts:
            if a.attempt < newest.attempt:
                earlier = self._tail(stream, a.attempt)
                self.post_message(LogLoaded(run_id, earlier, _heading(detail, a.attempt), earlier=True))
        self.post_message(LogLoaded(run_id, newest, _heading(detail, newest.attempt)))
        return newest.attempt, newest.next_offset

    def _tail(self, stream: Stream, attempt: int | None = None) -> LogChunk:
        """The end of an attempt's log (the newest one's by default): its last LOG_TAIL_BYTES, or
        more where those hold fewer than LOG_TAIL_LINES lines, up to LOG_TAIL_MAX_BYTES."""
        want = LOG_TAIL_BYTES
        while True:
            chunk = self._window(stream, attempt, want)
            attempt = chunk.attempt or attempt  # the same attempt, if a next one starts meanwhile
            enough = chunk.data.count("\n") >= LOG_TAIL_LINES
            if chunk.offset == 0 or enough or want >= LOG_TAIL_MAX_BYTES:
                return chunk
            want = min(want * 4, LOG_TAIL_MAX_BYTES)  # the API reads at most 1 MiB back

    def _window(self, stream: Stream, attempt: int | None, want: int) -> LogChunk:
        """The last `want` bytes of the log as one chunk: the daemon answers a part at a time."""
        first = last = self.backend.logs(self.summary.id, -want, stream, attempt)
        parts = [first.data]
        while first.attempt and last.data and last.next_offset < first.size:
            last = self.backend.logs(self.summary.id, last.next_offset, stream, first.attempt)
            parts.append(last.data)
        return last.model_copy(
            update={"data": "".join(parts), "offset": first.offset, "overflow": first.overflow}
        )

    def _read_on(self, stream: Stream, number: int, offset: int) -> tuple[int, int]:
        """What attempt `number` wrote since `offset`; once it has ended and written all, the next
        attempt's from its start when there is one. (The attempt read, where its log goes on.)"""
        run_id = self.summary.id
        chunk = self.backend.logs(run_id, offset, stream, number)
        self.post_message(LogLoaded(run_id, chunk))
        if not chunk.eof or self.backend.logs(run_id, -1, stream).attempt <= number:
            return number, chunk.next_offset
        detail = self.backend.run_detail(run_id)
        first = self.backend.logs(run_id, 0, stream, number + 1)
        self.post_message(LogLoaded(run_id, first, _heading(detail, number + 1)))
        return number + 1, first.next_offset

    def on_log_loaded(self, message: LogLoaded) -> None:
        chunk = message.chunk
        if chunk.stream != self.stream:
            return  # a read of the stream the user switched away from
        log = self.query_one("#log-view", ProgramLog)
        if message.heading:
            log.write_notice(message.heading)
        if chunk.overflow:
            log.write_notice("… (log skipped ahead: it grew faster than it was read)")
        if chunk.data:
            log.write_output(chunk.data)
            self._log_seen = True
        if message.earlier:
            return  # on the way to the newest attempt, which says where the log goes on
        self.log_offset, self.log_attempt = chunk.next_offset, chunk.attempt
        if not chunk.size and not self._log_seen and self.stream == "stdout" and not self._switched:
            # Nothing on stdout (the built-in runners write warnings to stderr): show stderr.
            self._switched = True
            self.stream = "stderr"
            self._switch_stream()
            return
        self._show_log_head(chunk.size)

    def _show_log_head(self, size_now: int) -> None:
        """`stderr · attempt 2 · o: stdout · …/attempts/2/stderr.log`, or why it is empty."""
        attempt = self.detail.attempts[-1] if self.detail and self.detail.attempts else None
        other = "stderr" if self.stream == "stdout" else "stdout"
        head = Text(self.stream, style="bold")
        empty = not size_now and not self._log_seen
        if empty:
            head.append(" is empty", style="italic")
        elif self._switched and self.stream == "stderr":
            head.append(" (stdout is empty)", style="dim")
        if attempt is not None:
            head.append(f" · attempt {attempt.attempt}", style="dim")
        head.append(f" · o: {other}", style="dim")
        # The line is one row: what is left after the keys goes to a hint or the file's path.
        room = (self.size.width or self.app.size.width) - 2 - head.cell_len - 3
        hint = "see the timeline (a) and charts (c)"
        if empty and len(hint) <= room:
            head.append(" · " + hint, style="italic")
        elif not empty and attempt is not None and room > 12:
            path = attempt.stdout_path if self.stream == "stdout" else attempt.stderr_path
            head.append(" · " + (path if len(path) <= room else "…" + path[-(room - 1) :]), style="dim")
        self.query_one("#log-head", Static).update(head)

    def on_detail_loaded(self, message: DetailLoaded) -> None:
        self.detail = message.detail
        self.summary = message.detail.run
        self.show_head()
        self.show_timeline()
        attempts = message.detail.attempts
        self.query_one(RankTable).show(attempts[-1] if attempts else None, message.detail.gpu_index)
        self.show_charts(message.detail)
        self.refresh_bindings()

    def show_timeline(self) -> None:
        if self.detail is None:
            return
        scroller = self.query_one("#timeline-scroll", Scroller)
        # Opened at the top (the attempts); afterwards, at the bottom it follows new events.
        follow = self._timeline_shown and scroller.at_end
        self._timeline_shown = True
        self.query_one("#timeline-text", Static).update(timeline_renderable(self.detail, self.raw_evidence))
        if follow:
            self.call_after_refresh(scroller.scroll_end, animate=False)

    def show_head(self) -> None:
        r = self.summary
        head = Text()
        # This screen has no status line: what that line would warn of comes first here, as it
        # does on the main screen (a dialog leaves the top line in sight; a run's long message,
        # wrapped, cannot push it past the head's last line).
        warning = self._warning()
        if warning is not None:
            head.append_text(warning).append("\n")
        head.append(r.name, style="bold")
        head.append(f" ({r.id}) {r.kind}  ", style="dim")
        head.append_text(state_text(r.state))
        where = ",".join(map(str, r.placed)) or ("CPU" if r.gpus == 0 else "–")
        head.append(f"  attempt {r.attempt}  GPU {where}" if r.placed else f"  attempt {r.attempt}  {where}")
        head.append(_progress_text(r), style="green")
        if r.message:
            head.append(f"\n{r.message}", style="italic")
        self.query_one("#run-head", Static).update(head)

    def _warning(self) -> Text | None:
        """Why the state and log stand still (no daemon), or what the daemon cannot write."""
        if self.has_class("-offline"):
            return Text(OFFLINE, style="bold yellow")
        status = self.gw.status
        if status is None or not status.storage_fault:
            return None
        return storage_warning(status.storage_fault, (self.size.width or self.app.size.width) - 2)

    def show_charts(self, detail: RunDetailView) -> None:
        metrics = detail.metrics
        boxes = {b.id: b for b in self.query(".chart-box").results(Vertical)}
        steps = _step_labels(metrics)
        last = metrics[-1] if metrics else None

        def fill(
            key: str, label: Text, values: list[float | None], lo: float, hi: float | None, fmt: Any
        ) -> None:
            box = boxes[f"chart-{key}"]
            box.query_one(".chart-label", Static).update(label)
            chart = box.query_one(Chart)
            chart.set_range(lo, hi)
            present = [v for v in values if v is not None]
            top = hi if hi is not None else max(present, default=None)
            chart.set_axes((fmt(top) if top is not None else "", fmt(lo)), steps, limit=None)
            chart.replace(values)

        loss = [m.loss for m in metrics]
        present = [v for v in loss if v is not None]
        lo, hi = (min(present), max(present)) if present else (0.0, None)
        span = (hi - lo) if hi is not None else 0.0
        loss_label = Text(f"loss  last {num(last.loss if last else None, '.4f')}")
        fill("loss", loss_label, loss, max(0.0, lo - 0.1 * span), hi, lambda v: f"{v:.3g}")
        rate = [m.samples_per_s for m in metrics]
        rate_label = Text(f"samples/s  last {num(last.samples_per_s if last else None, '.1f')}")
        fill("throughput", rate_label, rate, 0.0, None, lambda v: f"{v:.3g}")
        peak = [None if m.mem_peak is None else float(m.mem_peak) for m in metrics]
        peak_now = max((p for p in peak if p is not None), default=None)
        capacity = detail.mem_capacity
        label = Text(f"peak memory {size(peak_now)}")
        if capacity:
            label.append(f" of {size(capacity)} ", style="dim")
            label.append("── card's limit", style="red")
            if peak_now is not None and peak_now / capacity >= 0.95:
                label.append("  near capacity", style="bold red")
        fill("memory", label, peak, 0.0, capacity * 1.1 if capacity else None, size)
        if capacity:
            chart = boxes["chart-memory"].query_one(Chart)
            chart.set_axes((size(capacity * 1.1), "0"), steps, limit=float(capacity))
        for box in boxes.values():
            box.display = bool(metrics)
        self.query_one("#charts-empty", Static).display = not metrics

    # -- what is offered ----------------------------------------------------------------------

    @property
    def tab(self) -> str:
        """The tab shown ("timeline" while the screen is still being built)."""
        tabs = self.query("#detail-tabs").results(TabbedContent)
        return next((t.active for t in tabs if t.active), "timeline")

    def refusal(self, action: str) -> str | None:
        if action not in RUN_CONTROLS:
            return None
        return self.gw.control_refusal() or refusal(action, self.summary)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if not self.is_mounted:
            return True
        if action == "rerun_run" and parameters and self.refusal(action) is None:
            return bool(parameters[0]) == rerun_in_footer(self.summary)
        if action in RUN_CONTROLS:
            return self.refusal(action) is None
        if action == "toggle_evidence":
            return self.tab == "timeline" and bool(self.detail and self.detail.retunes)
        if action == "show_stream":
            return self.tab == "log" and parameters[:1] != (self.stream,)
        if action == "toggle_follow":
            return self.tab == "log"
        return True

    def on_key(self, event: events.Key) -> None:
        """A control key the run does not offer now says why."""
        action = _KEY_ACTION.get(event.key)
        why = self.refusal(action) if action else None
        if (
            event.key == "v"
            and self.tab == "timeline"
            and self.detail is not None
            and not self.detail.retunes
        ):
            why = "no retune in this run: the raw evidence is a retune's"
        if why:
            event.stop()
            self.notify(why, timeout=4)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()

    # -- actions ----------------------------------------------------------------------------

    def action_back(self) -> None:
        self.dismiss(None)

    def ask(self, request: Message) -> None:
        """Hand a request to the app (it opens the dialogs and runs the controls)."""
        self.app.post_message(request)

    def action_stop_run(self) -> None:
        self.ask(AskStop(self.summary))

    def action_resume_run(self) -> None:
        self.ask(AskResume(self.summary))

    def action_edit_run(self) -> None:
        self.ask(AskEdit(self.summary, self.detail))

    def action_tune_run(self) -> None:
        self.ask(AskTune(self.summary))

    def action_rerun_run(self, shown: int = 1) -> None:
        """`shown`: which of R's two bindings ran (the footer's or the unshown one); both ask."""
        self.ask(AskRerun(self.summary, self.detail))

    def action_detail_tab(self, tab: str) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = tab
        focus = {"timeline": "#timeline-scroll", "charts": "#charts-scroll", "log": "#log-view"}
        if tab in focus:
            self.call_after_refresh(self.query_one(focus[tab]).focus)
        if tab == "doctor":
            self.query_one("#doctor-text", Static).update("diagnosing …")
            self._load_doctor(self.summary.id)
            self.call_after_refresh(self.query_one("#doctor-scroll").focus)
        self.refresh_bindings()

    def action_toggle_evidence(self) -> None:
        self.raw_evidence = not self.raw_evidence
        self.show_timeline()

    def action_show_stream(self, stream: Stream) -> None:
        self.stream = stream
        self._switch_stream()

    def _switch_stream(self) -> None:
        self.refresh_bindings()
        self.log_offset = -LOG_TAIL_BYTES
        self.log_attempt = 0
        self._log_seen = False
        self.query_one("#log-view", ProgramLog).clear()
        self._show_log_head(0)
        self._tail_log()

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.query_one("#log-view", ProgramLog).auto_scroll = self.follow
        if self.follow:
            self._tail_log()
        self.notify("following the log" if self.follow else "log paused", timeout=2)

    def back_online(self) -> None:
        """The daemon is reachable again: the log's reader ended with the connection."""
        self.show_head()
        self.reload()
        if self.follow:
            self._tail_log()

    def run_changed(self, run: RunRow) -> None:
        """Called by the app when the stream says this run changed."""
        self.summary = run
        self.show_head()
        self.refresh_bindings()
        self.reload()


def _progress_text(run: RunRow) -> str:
    """`  30 %, 7s left` while it runs, from what it reports or the bar it draws ("" unknown)."""
    fraction = progress_fraction(run)
    if run.state != "running" or fraction is None:
        return ""
    left = eta_seconds(run)
    return f"  {100 * fraction:.0f} %" + (f", {duration(left)} left" if left is not None else "")


def _heading(detail: RunDetailView, attempt: int) -> str:
    return attempt_heading(attempt, detail.attempts, detail.retunes, world_size_of(detail.spec))


def _step_labels(metrics: list[RunMetric]) -> list[tuple[float, str]]:
    """Step numbers under a chart of `metrics`: the first, the middle and the last, each once
    (a short run's middle report is often its last step again)."""
    steps = [m.step for m in metrics if m.step is not None]
    if not steps:
        return []
    middle = steps[len(steps) // 2]
    labels = [(0.0, f"step {compact(steps[0])}")]
    if middle not in (steps[0], steps[-1]):
        labels.append((0.5, compact(middle)))
    if steps[-1] != steps[0]:
        labels.append((1.0, compact(steps[-1])))
    return labels


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def doctor_text(findings: list[DoctorFinding]) -> RenderableType:
    """Doctor's findings, most severe first, each with its evidence and fix (wrapped lines keep
    their indent)."""
    if not findings:
        return Text("no findings: nothing doctor would change", style="green")
    parts: list[RenderableType] = []
    for f in findings:
        head = Text(f"{f.severity:8}", style=_SEVERITY_STYLE.get(f.severity, ""))
        head.append(f.title, style="bold")
        parts.append(head)
        if f.evidence:
            parts.append(_indented(Text(f"evidence: {f.evidence}", style="dim"), 8))
        if f.fix:
            parts.append(_indented(Text(f"fix: {f.fix}"), 8))
    return Group(*parts)
