"""The history tab: for each GPU a chart per chosen metric, and the host's CPU and memory, over a
chosen window, with one cursor that reads out every chart's value at the same moment.

The backend picks the rollup tier from the window and the number of points asked for (two per
character cell of the chart), so a 30-day window costs the same to draw as a 5-minute one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.tui.backend import DashboardBackend
from gpuwarden.tui.formatting import clock
from gpuwarden.tui.messages import HistoryLoaded
from gpuwarden.tui.metrics import CHART_METRICS, HOST_CHART_METRICS, METRICS_BY_KEY, ChartMetric
from gpuwarden.tui.widgets.chart import SAMPLES_PER_CELL, Chart

WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0),
    ("1h", 3600.0),
    ("24h", 86_400.0),
    ("7d", 7 * 86_400.0),
    ("30d", 30 * 86_400.0),
)
WINDOW_SECONDS = dict(WINDOWS)
HOST = "host"
Points = list[tuple[float, float | None]]


class SeriesChart(Vertical):
    """One metric of one GPU (or of the host): a label line and its chart."""

    DEFAULT_CSS = """
    SeriesChart { height: auto; }
    SeriesChart .label { height: 1; padding: 0 1 0 3; }
    SeriesChart Chart { margin: 0 1 0 3; }
    """

    def __init__(self, metric: ChartMetric, height: int, style: str) -> None:
        super().__init__()
        self.metric = metric
        self.label = Static(classes="label")
        self.chart = Chart(height=height, style=style)
        self.chart.styles.height = height
        self.times: list[float] = []

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.chart

    def index_at(self, ts: float) -> int | None:
        """The point nearest `ts` (charts of another tier may have other timestamps)."""
        if not self.times:
            return None
        i = bisect.bisect_left(self.times, ts)
        if i == len(self.times) or (i > 0 and ts - self.times[i - 1] <= self.times[i] - ts):
            i -= 1
        return i


class HistoryBlock(Vertical):
    """A title line (GPU or host, and the cursor's time) and one SeriesChart per metric."""

    DEFAULT_CSS = """
    HistoryBlock { height: auto; margin-bottom: 1; }
    HistoryBlock .title { height: 1; padding: 0 1; }
    """

    def __init__(self, key: str, title: str, metrics: Sequence[ChartMetric], style: str) -> None:
        super().__init__()
        self.key = key  # a GPU UUID or HOST
        self.title_text = title
        self.title = Static(classes="title")
        # One metric gets a taller chart; several share the room.
        height = 4 if len(metrics) == 1 else 3
        self.charts = [SeriesChart(m, height, style) for m in metrics]

    def compose(self) -> ComposeResult:
        yield self.title
        yield from self.charts


class HistoryPane(VerticalScroll, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "cursor(-1)", "Cursor ←", show=False),
        Binding("right", "cursor(1)", "Cursor →", show=False),
        Binding("shift+left", "cursor(-10)", show=False),
        Binding("shift+right", "cursor(10)", show=False),
        Binding("home", "cursor_edge(0)", show=False),
        Binding("end", "cursor_edge(1)", show=False),
        Binding("w", "cycle_window(1)", "Window"),
        Binding("W", "cycle_window(-1)", show=False),
    ]
    DEFAULT_CSS = """
    HistoryPane #history-head { height: 1; padding: 0 1; margin-bottom: 1; }
    HistoryPane #history-empty { padding: 0 1; color: $warning; height: auto; margin-bottom: 1; }
    """

    def __init__(
        self, backend: DashboardBackend, clock_fn: Callable[[], float], *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.backend = backend
        self.clock = clock_fn
        self.window = "5m"
        self.metrics: tuple[str, ...] = (CHART_METRICS[0].key,)
        self.cursor: int | None = None  # index into the first chart's points; None: the newest
        self.loaded: tuple[str, tuple[str, ...]] | None = None  # (window, metrics) on screen
        self._statics: list[GpuStatic] | None = None

    @property
    def wanted(self) -> tuple[str, tuple[str, ...]]:
        """(window, metrics) the user asked for; `loaded` equals it once the charts show it."""
        return self.window, self.metrics

    def compose(self) -> ComposeResult:
        yield Static(id="history-head")
        yield Static(id="history-empty")

    async def set_gpus(self, statics: list[GpuStatic], sampling: str | None) -> None:
        if self._statics is not None and [s.uuid for s in statics] == [s.uuid for s in self._statics]:
            return
        self._statics = sorted(statics, key=lambda s: s.index)
        empty = self.query_one("#history-empty", Static)
        empty.display = not statics
        empty.update(f"No GPU history: {sampling or 'no NVIDIA GPU'}. The host's history is below.")
        await self._rebuild()

    async def _rebuild(self) -> None:
        """One block per GPU with a chart per chosen metric, then the host's block."""
        await self.query(HistoryBlock).remove()
        metrics = [METRICS_BY_KEY[k] for k in self.metrics]
        blocks = [
            HistoryBlock(s.uuid, f"GPU {s.index} {s.name}", metrics, "cyan") for s in self._statics or []
        ]
        blocks.append(HistoryBlock(HOST, "Host", HOST_CHART_METRICS, "green"))
        await self.mount_all(blocks)
        self.loaded = None
        self._show_head()

    def _show_head(self) -> None:
        head = Text()
        head.append("window ", style="dim")
        for name, _ in WINDOWS:
            head.append(f" {name} ", style="bold reverse" if name == self.window else "")
        if self._statics:
            head.append("   ")
            head.append(", ".join(METRICS_BY_KEY[k].label for k in self.metrics), style="bold")
        if self.loaded != self.wanted:
            head.append("  loading…", style="yellow")
        self.query_one("#history-head", Static).update(head)

    # -- loading ----------------------------------------------------------------------------

    def reload(self) -> None:
        """Fetch the window for every GPU and the host (in a thread; the newest request wins)."""
        if self._statics is None:
            return  # not connected yet
        now = self.clock()
        # Two points per cell of the chart (the pane's width less its margins); the pane may be
        # hidden when this runs, so the app's width stands in for it.
        width = (self.size.width or self.app.size.width) - 4
        points = max(10, width * SAMPLES_PER_CELL)
        start = now - WINDOW_SECONDS[self.window]
        self._show_head()
        self._load(self.window, self.metrics, [s.uuid for s in self._statics], start, now, points)

    @work(thread=True, exclusive=True, exit_on_error=False, group="history")
    def _load(
        self, window: str, metrics: tuple[str, ...], uuids: list[str], start: float, end: float, points: int
    ) -> None:
        series = self.backend.history(uuids, metrics, start, end, points) if uuids else {}
        # Memory's total rides along: it is the ceiling of the memory chart.
        host = self.backend.host_history(["cpu_percent", "mem_used", "mem_total"], start, end, points)
        self.post_message(HistoryLoaded(window, metrics, start, end, series, host))

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        if (message.window, message.metrics) != self.wanted:
            return  # an answer to a request the user has already moved on from
        self.apply(message.series, message.host)
        self.loaded = (message.window, message.metrics)
        self._show_head()

    def apply(self, series: dict[str, dict[str, Points]], host: dict[str, Points]) -> None:
        statics = {s.uuid: s for s in self._statics or []}
        totals = [v for _, v in host.get("mem_total", []) if v]
        for block in self.query(HistoryBlock):
            for sc in block.charts:
                if block.key == HOST:
                    points = host.get(sc.metric.key, [])
                    top = 100.0 if sc.metric.key == "cpu_percent" else (max(totals) if totals else None)
                else:
                    points = series.get(block.key, {}).get(sc.metric.key, [])
                    top = sc.metric.ceiling(statics.get(block.key), None)
                sc.times = [ts for ts, _ in points]
                sc.chart.set_range(0.0, top)
                sc.chart.replace(v for _, v in points)
        self._place_cursor()

    # -- the cursor -------------------------------------------------------------------------

    def _charts(self) -> list[SeriesChart]:
        return [sc for block in self.query(HistoryBlock) for sc in block.charts]

    def _reference(self) -> SeriesChart | None:
        """The chart whose points the cursor indexes: the first one with any."""
        return next((sc for sc in self._charts() if sc.times), None)

    def _place_cursor(self) -> None:
        ref = self._reference()
        ts: float | None = None
        if ref is not None:
            n = len(ref.times)
            if self.cursor is not None and self.cursor >= n:
                self.cursor = None
            ts = ref.times[n - 1 if self.cursor is None else self.cursor]
        for sc in self._charts():
            sc.chart.set_cursor(None if ts is None else sc.index_at(ts))
        self._show_values(ts)

    def _show_values(self, ts: float | None) -> None:
        with_date = self.window in ("7d", "30d")
        for block in self.query(HistoryBlock):
            title = Text()
            title.append(block.title_text, style="bold")
            if ts is not None:
                title.append(f"   ▸ {clock(ts, with_date=with_date)}", style="bold")
            block.title.update(title)
            for sc in block.charts:
                label = Text()
                label.append(f"{sc.metric.label:<12}", style="dim")
                values = [v for v in sc.chart.values if v is not None]
                i = sc.chart.cursor
                label.append(sc.metric.show(sc.chart.values[i] if i is not None else None), style="bold cyan")
                if values:
                    label.append(f"   max {sc.metric.show(max(values))}", style="dim")
                sc.label.update(label)

    # -- actions ----------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        ref = self._reference()
        if ref is None:
            return
        n = len(ref.times)
        self.cursor = max(0, min(n - 1, (n - 1 if self.cursor is None else self.cursor) + delta))
        self._place_cursor()

    def action_cursor_edge(self, end: int) -> None:
        ref = self._reference()
        if ref is not None:
            self.cursor = None if end else 0
            self._place_cursor()

    def action_cycle_window(self, step: int) -> None:
        names = [name for name, _ in WINDOWS]
        self.window = names[(names.index(self.window) + step) % len(names)]
        self.cursor = None
        self.reload()

    def cycle_metric(self, step: int) -> None:
        """`m`: the first chart shows the next metric that is not already charted."""
        keys = [m.key for m in CHART_METRICS]
        rest = self.metrics[1:]
        i = keys.index(self.metrics[0])
        for _ in keys:
            i = (i + step) % len(keys)
            if keys[i] not in rest:
                break
        self.call_later(self.set_metrics, (keys[i], *rest))

    async def set_metrics(self, metrics: Sequence[str]) -> None:
        """Chart `metrics` (CHART_METRICS keys, in the order given) for every GPU."""
        chosen = tuple(dict.fromkeys(k for k in metrics if k in METRICS_BY_KEY))
        if not chosen or chosen == self.metrics:
            return
        self.metrics = chosen
        await self._rebuild()
        self.reload()
