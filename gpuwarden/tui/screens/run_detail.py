"""One run: its attempts and retunes (settings before → after, verdict, evidence), charts of loss,
throughput and peak memory against the card, and the log tail."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Log, Static, TabbedContent, TabPane

from gpuwarden.core.api import Retune
from gpuwarden.tui.backend import DashboardBackend, DoctorFinding, RunDetailView, RunRow
from gpuwarden.tui.formatting import GIB, clock, duration, gib, num
from gpuwarden.tui.keys import CONTROL_ACTIONS
from gpuwarden.tui.messages import DetailLoaded, DoctorLoaded, LogLoaded
from gpuwarden.tui.screens.runs import state_text
from gpuwarden.tui.widgets.chart import Chart
from gpuwarden.tui.widgets.rank_table import RankTable

if TYPE_CHECKING:
    from gpuwarden.tui.app import GpuwardenApp

LOG_TAIL_BYTES = 32_768  # what the log tab shows first: enough for a screenful many times over
LOG_POLL_S = 1.0


def _value(v: Any) -> str:
    return "–" if v is None else str(v)


def retune_text(rt: Retune) -> Text:
    """The settings that changed (before → after), the verdict, the evidence and the outcome."""
    text = Text()
    text.append("    retune ", style="bold magenta")
    text.append(f"at {clock(rt.ts)}")
    if rt.verdict:
        text.append("  verdict ", style="dim")
        text.append(rt.verdict, style="bold")
    if rt.outcome:
        text.append("  → ", style="dim")
        text.append(rt.outcome, style="green" if rt.outcome == "succeeded" else "yellow")
    for key in sorted(set(rt.before) | set(rt.after)):
        before, after = rt.before.get(key), rt.after.get(key)
        text.append(f"\n      {key:<24} ")
        text.append(_value(before), style="red" if before != after else "")
        text.append(" → ")
        text.append(_value(after), style="green" if before != after else "")
    if rt.evidence:
        text.append("\n      evidence ", style="dim")
        text.append("  ".join(f"{k}={v}" for k, v in rt.evidence.items()))
    return text


def timeline_text(detail: RunDetailView) -> Text:
    """Attempts in order, each followed by the retune that ended it, then the latest events."""
    text = Text()
    by_attempt: dict[int, list[Retune]] = {}
    for rt in detail.retunes:
        by_attempt.setdefault(rt.attempt, []).append(rt)
    if not detail.attempts:
        text.append("No attempt yet: the run waits in the queue.\n", style="dim")
    for a in detail.attempts:
        text.append(f"#{a.attempt:<3}", style="bold")
        end = clock(a.ended_at) if a.ended_at else "now"
        text.append(f"{clock(a.started_at)} → {end}  ")
        if a.started_at:
            text.append(
                f"({duration((a.ended_at or a.started_at) - a.started_at) if a.ended_at else a.state})  "
            )
        outcome = a.classification or a.state
        text.append(outcome, style="bold red" if outcome in ("oom", "failed") else "bold green")
        gpus = [detail.gpu_index[u] for u in a.gpus if u in detail.gpu_index]
        if gpus:
            text.append(f"  GPU {','.join(map(str, gpus))}", style="dim")
        if a.exit_code is not None:
            text.append(f"  exit {a.exit_code}", style="dim")
        if a.reason:
            text.append(f"\n     {a.reason}", style="italic")
        text.append("\n")
        for rt in by_attempt.get(a.attempt, []):
            text.append_text(retune_text(rt))
            text.append("\n")
    if detail.events:
        text.append("\nEvents\n", style="bold")
        for e in detail.events[-20:]:
            text.append(f"  {clock(e.ts)} ", style="dim")
            text.append(f"{e.type:<10}", style="magenta" if e.type in ("oom", "error") else "cyan")
            text.append(f" {e.text}\n")
    return text


class RunDetailScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("s", "stop_run", "Stop"),
        Binding("r", "resume_run", "Resume"),
        Binding("e", "edit_run", "Edit"),
        Binding("t", "tune_run", "Tune"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("a", "detail_tab('timeline')", "Timeline", show=False),
        Binding("c", "detail_tab('charts')", "Charts", show=False),
        Binding("l", "detail_tab('log')", "Log", show=False),
        Binding("d", "detail_tab('doctor')", "Doctor", show=False),
    ]
    DEFAULT_CSS = """
    RunDetailScreen #run-head { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    RunDetailScreen #detail-tabs { height: 1fr; }
    RunDetailScreen TabPane { height: 1fr; padding: 0; }
    RunDetailScreen #timeline-text { padding: 0 1; }
    RunDetailScreen .chart-label { height: 1; padding: 0 1; }
    RunDetailScreen Chart { height: 3; margin: 0 1 1 1; }
    RunDetailScreen Log { height: 1fr; }
    """

    def __init__(self, backend: DashboardBackend, run: RunRow) -> None:
        super().__init__()
        self.backend = backend
        self.summary = run
        self.detail: RunDetailView | None = None
        self.follow = True
        self.log_offset = -LOG_TAIL_BYTES
        self._stop_log = threading.Event()

    @property
    def gw(self) -> GpuwardenApp:
        from gpuwarden.tui.app import GpuwardenApp

        assert isinstance(self.app, GpuwardenApp)
        return self.app

    def compose(self) -> ComposeResult:
        yield Static(id="run-head")
        with TabbedContent(initial="timeline", id="detail-tabs"):
            with TabPane("Timeline", id="timeline"), VerticalScroll():
                yield RankTable()
                yield Static(id="timeline-text")
            with TabPane("Charts", id="charts"), VerticalScroll():
                for key, style in (("loss", "yellow"), ("throughput", "cyan"), ("memory", "magenta")):
                    with Vertical(id=f"chart-{key}", classes="chart-box"):
                        yield Static(classes="chart-label")
                        yield Chart(height=3, style=style, fit=True)
            with TabPane("Log", id="log"):
                yield Log(max_lines=5000, auto_scroll=True, id="log-view")
            with TabPane("Doctor", id="doctor"), VerticalScroll():
                yield Static("(press d to diagnose this run)", id="doctor-text")
        yield Footer()

    def on_mount(self) -> None:
        self.show_head()
        self.reload()
        self._tail_log()

    def on_unmount(self) -> None:
        self._stop_log.set()

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
        """Read the log from where we left off, every second while following."""
        offset = self.log_offset
        while not self._stop_log.is_set():
            chunk = self.backend.logs(self.summary.id, offset)
            offset = chunk.next_offset
            if chunk.data or chunk.overflow:
                self.post_message(LogLoaded(self.summary.id, chunk))
            if not self.follow:
                return
            self._stop_log.wait(LOG_POLL_S)

    def on_log_loaded(self, message: LogLoaded) -> None:
        log = self.query_one("#log-view", Log)
        if message.chunk.overflow:
            log.write_line("… (log skipped ahead: it grew faster than it was read)")
        log.write(message.chunk.data)
        self.log_offset = message.chunk.next_offset

    def on_detail_loaded(self, message: DetailLoaded) -> None:
        self.detail = message.detail
        self.summary = message.detail.run
        self.show_head()
        self.query_one("#timeline-text", Static).update(timeline_text(message.detail))
        attempts = message.detail.attempts
        self.query_one(RankTable).show(attempts[-1] if attempts else None, message.detail.gpu_index)
        self.show_charts(message.detail)

    def show_head(self) -> None:
        r = self.summary
        head = Text()
        head.append(r.name, style="bold")
        head.append(f" ({r.id}) {r.kind}  ", style="dim")
        head.append_text(state_text(r.state))
        head.append(f"  attempt {r.attempt}  GPU {','.join(map(str, r.placed)) or '–'}")
        if r.message:
            head.append(f"\n{r.message}", style="italic")
        self.query_one("#run-head", Static).update(head)

    def show_charts(self, detail: RunDetailView) -> None:
        metrics = detail.metrics
        loss = [m.loss for m in metrics]
        rate = [m.samples_per_s for m in metrics]
        peak = [None if m.mem_peak is None else float(m.mem_peak) for m in metrics]
        last = metrics[-1] if metrics else None
        boxes = {b.id: b for b in self.query(".chart-box").results(Vertical)}

        def fill(key: str, label: Text, values: list[float | None], vmax: float | None) -> None:
            box = boxes[f"chart-{key}"]
            box.query_one(".chart-label", Static).update(label)
            chart = box.query_one(Chart)
            chart.set_range(0.0, vmax)
            chart.replace(values)

        fill("loss", Text(f"loss  last {num(last.loss if last else None, '.4f')}"), loss, None)
        fill(
            "throughput",
            Text(f"samples/s  last {num(last.samples_per_s if last else None, '.1f')}"),
            rate,
            None,
        )
        peak_now = max((p for p in peak if p is not None), default=None)
        capacity = detail.mem_capacity
        label = Text(f"peak memory {gib(peak_now)} GiB")
        if capacity:
            label.append(f" of {capacity / GIB:.1f} GiB card", style="dim")
            if peak_now is not None and peak_now / capacity >= 0.95:
                label.append("  near capacity", style="bold red")
        fill("memory", label, peak, float(capacity) if capacity else None)

    # -- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in CONTROL_ACTIONS and self.gw.readonly)

    def action_back(self) -> None:
        self.dismiss(None)

    def action_stop_run(self) -> None:
        self.gw.ask_stop(self.summary)

    def action_resume_run(self) -> None:
        self.gw.ask_resume(self.summary)

    def action_edit_run(self) -> None:
        self.gw.ask_edit(self.summary, self.detail.spec if self.detail else None)

    def action_tune_run(self) -> None:
        self.gw.ask_tune(self.summary)

    def action_detail_tab(self, tab: str) -> None:
        self.query_one("#detail-tabs", TabbedContent).active = tab
        if tab == "doctor":
            self.query_one("#doctor-text", Static).update("diagnosing …")
            self._load_doctor(self.summary.id)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.query_one("#log-view", Log).auto_scroll = self.follow
        if self.follow:
            self._tail_log()
        self.notify("following the log" if self.follow else "log paused", timeout=2)

    def run_changed(self, run: RunRow) -> None:
        """Called by the app when the stream says this run changed."""
        self.summary = run
        self.show_head()
        self.reload()


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def doctor_text(findings: list[DoctorFinding]) -> Text:
    """Doctor's findings, most severe first, each with its evidence and fix."""
    out = Text()
    if not findings:
        out.append("no findings: nothing doctor would change", style="green")
        return out
    for f in findings:
        out.append(f"{f.severity:8}", style=_SEVERITY_STYLE.get(f.severity, ""))
        out.append(f.title + "\n", style="bold")
        if f.evidence:
            out.append(f"        evidence: {f.evidence}\n", style="dim")
        if f.fix:
            out.append(f"        fix: {f.fix}\n")
    return out
