"""The history tab: one chart per GPU over a chosen window, with a cursor that reads out values.

The backend picks the rollup tier from the window and the number of points asked for (two per
character cell of the chart), so a 30-day window costs the same to draw as a 5-minute one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.tui.backend import DashboardBackend, HistorySeries
from gpuwarden.tui.formatting import clock
from gpuwarden.tui.messages import HistoryLoaded
from gpuwarden.tui.metrics import CHART_METRICS, METRICS_BY_KEY, ChartMetric, next_metric
from gpuwarden.tui.widgets.chart import SAMPLES_PER_CELL, Chart

WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0),
    ("1h", 3600.0),
    ("24h", 86_400.0),
    ("7d", 7 * 86_400.0),
    ("30d", 30 * 86_400.0),
)
WINDOW_SECONDS = dict(WINDOWS)


class HistoryChart(Vertical):
    """A label line and a chart for one GPU."""

    DEFAULT_CSS = """
    HistoryChart { height: auto; margin-bottom: 1; }
    HistoryChart .label { height: 1; padding: 0 1; }
    HistoryChart Chart { height: 4; margin: 0 1; }
    """

    def __init__(self, static: GpuStatic) -> None:
        super().__init__()
        self.static = static
        self.label = Static(classes="label")
        self.chart = Chart(height=4, style="cyan")
        self.times: list[float] = []

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.chart


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
    HistoryPane #history-empty { padding: 0 1; color: $warning; height: auto; }
    """

    def __init__(
        self, backend: DashboardBackend, clock_fn: Callable[[], float], *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.backend = backend
        self.clock = clock_fn
        self.window = "5m"
        self.metric = CHART_METRICS[0].key
        self.cursor: int | None = None
        self.loaded: tuple[str, str] | None = None  # (window, metric) on screen
        self._statics: list[GpuStatic] = []

    def compose(self) -> ComposeResult:
        yield Static(id="history-head")
        yield Static(id="history-empty")

    async def set_gpus(self, statics: list[GpuStatic], sampling: str | None) -> None:
        if [s.uuid for s in statics] == [s.uuid for s in self._statics]:
            return
        self._statics = sorted(statics, key=lambda s: s.index)
        await self.query(HistoryChart).remove()
        await self.mount_all([HistoryChart(s) for s in self._statics])
        empty = self.query_one("#history-empty", Static)
        empty.display = not statics
        empty.update(f"No GPU history: {sampling or 'no NVIDIA GPU'}")
        self._show_head()

    def _show_head(self) -> None:
        head = Text()
        head.append("window ", style="dim")
        for name, _ in WINDOWS:
            head.append(f" {name} ", style="bold reverse" if name == self.window else "")
        head.append("   metric ", style="dim")
        head.append(METRICS_BY_KEY[self.metric].label, style="bold")
        if self.loaded != (self.window, self.metric):
            head.append("  loading…", style="yellow")
        self.query_one("#history-head", Static).update(head)

    # -- loading ----------------------------------------------------------------------------

    def reload(self) -> None:
        """Fetch the current window and metric for every GPU (in a thread; newest request wins)."""
        if not self._statics:
            return
        now = self.clock()
        # Two points per cell of the chart (the pane's width less its margins); the pane may be
        # hidden when this runs, so the app's width stands in for it.
        width = (self.size.width or self.app.size.width) - 2
        points = max(10, width * SAMPLES_PER_CELL)
        start = now - WINDOW_SECONDS[self.window]
        self._show_head()
        self._load(self.window, self.metric, [s.uuid for s in self._statics], start, now, points)

    @work(thread=True, exclusive=True, exit_on_error=False, group="history")
    def _load(
        self, window: str, metric: str, uuids: list[str], start: float, end: float, points: int
    ) -> None:
        series = self.backend.history(uuids, [metric], start, end, points)
        self.post_message(HistoryLoaded(window, metric, start, end, series))

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        if (message.window, message.metric) != (self.window, self.metric):
            return  # an answer to a request the user has already moved on from
        self.apply(message.series, METRICS_BY_KEY[message.metric])
        self.loaded = (message.window, message.metric)
        self._show_head()

    def apply(self, series: HistorySeries, metric: ChartMetric) -> None:
        for hc in self.query(HistoryChart):
            points = series.get(hc.static.uuid, {}).get(metric.key, [])
            hc.times = [ts for ts, _ in points]
            hc.chart.set_range(0.0, metric.ceiling(hc.static, None))
            hc.chart.replace(v for _, v in points)
            if self.cursor is None or self.cursor >= len(points):
                hc.chart.set_cursor(len(points) - 1 if points else None)
            else:
                hc.chart.set_cursor(self.cursor)
        self._show_cursor()

    def _show_cursor(self) -> None:
        metric = METRICS_BY_KEY[self.metric]
        for hc in self.query(HistoryChart):
            label = Text()
            label.append(f"GPU {hc.static.index} ", style="bold")
            label.append(hc.static.name)
            values = [v for v in hc.chart.values if v is not None]
            if values:
                label.append(f"  max {metric.show(max(values))}", style="dim")
            i = hc.chart.cursor
            if i is not None and i < len(hc.times):
                label.append(
                    f"   ▸ {clock(hc.times[i], with_date=self.window in ('7d', '30d'))} ", style="bold"
                )
                label.append(metric.show(hc.chart.values[i]), style="bold cyan")
            hc.label.update(label)

    # -- actions ----------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        charts = list(self.query(HistoryChart))
        if not charts or not charts[0].chart.values:
            return
        current = charts[0].chart.cursor
        n = len(charts[0].chart.values)
        self.cursor = max(0, min(n - 1, (n - 1 if current is None else current) + delta))
        for hc in charts:
            hc.chart.set_cursor(self.cursor)
        self._show_cursor()

    def action_cursor_edge(self, end: int) -> None:
        charts = list(self.query(HistoryChart))
        if charts and charts[0].chart.values:
            self.action_cursor(len(charts[0].chart.values) if end else -len(charts[0].chart.values))

    def action_cycle_window(self, step: int) -> None:
        names = [name for name, _ in WINDOWS]
        self.window = names[(names.index(self.window) + step) % len(names)]
        self.cursor = None
        self.reload()

    def cycle_metric(self, step: int) -> None:
        self.metric = next_metric(self.metric, step)
        self.reload()
