"""The history tab: for each GPU a chart per chosen metric, and the host's, over a chosen window,
with one cursor that reads out every chart's value at the same moment.

The backend picks the rollup tier from the window and the number of points asked for (two per
character cell of the chart), so a 30-day window costs the same to draw as a 5-minute one. The
5-minute window follows live: each sample frame is folded into the newest point, and a new point
is appended (the oldest falls off) when its time comes, as nvitop's graphs move. Longer windows
are fetched again on a slower cadence. The head says how old the newest point is.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.events import Resize
from textual.timer import Timer
from textual.widgets import Static

from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.core.units import duration
from gpuwarden.tui.backend import DashboardBackend, HistorySeries, HostSeries, Point, Snapshot
from gpuwarden.tui.formatting import clock
from gpuwarden.tui.messages import ChartResized, HistoryLoaded
from gpuwarden.tui.metrics import (
    CHART_METRICS,
    HOST_METRICS_BY_KEY,
    METRICS_BY_KEY,
    ChartMetric,
)
from gpuwarden.tui.widgets.chart import SAMPLES_PER_CELL, Chart

WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0),
    ("1h", 3600.0),
    ("24h", 86_400.0),
    ("7d", 7 * 86_400.0),
    ("30d", 30 * 86_400.0),
)
WINDOW_SECONDS = dict(WINDOWS)
LIVE_WINDOW = "5m"  # follows the sample frames
# Seconds between two fetches of a longer window: about a point's width, at least every few ticks.
REFRESH_S = {"1h": 30.0, "24h": 60.0, "7d": 300.0, "30d": 900.0}
HOST = "host"
GUTTER = 8  # the y-axis labels: "80 GiB┤"
# A chart may shrink to one row (four dots) so that the default view, with every chart's axis,
# fits an 80×24 terminal; more rows go to the charts when there are more.
MIN_HEIGHT, MAX_HEIGHT = 1, 14
RESIZE_SETTLE_S = 0.2  # a drag resizes many times: fetch once it stops


def ago(seconds: float) -> str:
    """-5m, -2.5m, -12h, -3.5d: an axis label."""
    if seconds < 3600:
        return f"-{seconds / 60:g}m"
    if seconds < 86_400:
        return f"-{seconds / 3600:g}h"
    return f"-{seconds / 86_400:g}d"


class SeriesChart(Vertical):
    """One metric of one GPU (or of the host): a label line and its chart."""

    DEFAULT_CSS = """
    SeriesChart { height: auto; }
    SeriesChart .label { height: 1; padding: 0 1 0 1; }
    SeriesChart Chart { margin: 0 1 0 1; }
    """

    def __init__(self, metric: ChartMetric, style: str, *, axis: bool) -> None:
        super().__init__()
        self.metric = metric
        self.label = Static(classes="label")
        self.axis = axis
        self.chart = Chart(height=MIN_HEIGHT + axis, style=style, y_gutter=GUTTER, axis=axis)
        self.points: list[Point] = []
        self._live_count = 0  # readings folded into the newest point since the last fetch

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.chart

    def set_plot_height(self, rows: int) -> None:
        self.chart.styles.height = rows + self.axis

    def on_resize(self, event: Resize) -> None:
        # The pane's own size does not change when its scrollbar appears, but the plot narrows.
        self.post_message(ChartResized())

    @property
    def times(self) -> list[float]:
        return [p.ts for p in self.points]

    def set_points(self, points: list[Point]) -> None:
        self.points = list(points)
        self._live_count = 1 if points and points[-1].value is not None else 0
        self.chart.replace(p.value for p in self.points)

    def fold(self, ts: float, value: float | None, step: float) -> int:
        """Fold one live reading in; returns how many points fell off the left (the series keeps
        its length, so the chart's scale of time does not change)."""
        if not self.points or step <= 0:
            return 0
        last = self.points[-1]
        if ts < last.ts + step / 2:
            if value is not None:
                n = self._live_count if last.value is not None else 0
                mean = value if last.value is None else (last.value * n + value) / (n + 1)
                peak = value if last.peak is None else max(last.peak, value)
                self.points[-1] = Point(last.ts, mean, peak)
                self._live_count = n + 1
            return 0
        new = math.floor((ts - (last.ts + step / 2)) / step) + 1
        fresh = [Point(last.ts + j * step, None) for j in range(1, new)]
        fresh.append(Point(last.ts + new * step, value, value))
        dropped = min(len(self.points), len(fresh))
        self.points = (self.points + fresh)[-len(self.points) :]
        self._live_count = 1 if value is not None else 0
        return dropped

    def index_at(self, ts: float) -> int | None:
        """The point nearest `ts` (charts of another tier may have other timestamps)."""
        times = self.times
        if not times:
            return None
        i = bisect.bisect_left(times, ts)
        if i == len(times) or (i > 0 and ts - times[i - 1] <= times[i] - ts):
            i -= 1
        return i


class HistoryBlock(Vertical):
    """A title line (GPU or host, and the cursor's time) and one SeriesChart per metric; the last
    chart carries the time axis."""

    DEFAULT_CSS = """
    HistoryBlock { height: auto; margin-bottom: 1; }
    HistoryBlock .title { height: 1; padding: 0 1; }
    """

    def __init__(self, key: str, title: str, metrics: Sequence[ChartMetric], style: str) -> None:
        super().__init__()
        self.key = key  # a GPU UUID or HOST
        self.title_text = title
        self.title = Static(classes="title")
        self.charts = [SeriesChart(m, style, axis=i == len(metrics) - 1) for i, m in enumerate(metrics)]

    def compose(self) -> ComposeResult:
        yield self.title
        yield from self.charts

    def reading(self, snap: Snapshot, metric: ChartMetric) -> float | None:
        """This block's value of `metric` in a live frame."""
        if self.key == HOST:
            raw = getattr(snap.host, metric.key, None) if snap.host else None
            return None if raw is None else float(raw)
        sample = next((s for s in snap.gpus if s.uuid == self.key), None)
        return None if sample is None else metric.value(sample)


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
        self.window = LIVE_WINDOW
        self.metrics: tuple[str, ...] = (CHART_METRICS[0].key,)
        self.host_metrics: tuple[str, ...] = ("cpu_percent", "mem_used")
        self.cursor: int | None = None  # index into the first chart's points; None: the newest
        self.loaded: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None  # what is on screen
        self.loaded_at: float | None = None
        self.loaded_points = 0  # points per chart of the last fetch (from the chart's width)
        self.step = 0.0  # seconds per point of what is on screen
        self.newest_ts: float | None = None  # the time of the newest reading on screen
        self._stale = False  # a gap (a reconnect) since the last fetch: fetch again on show
        self._loading = False
        self._statics: list[GpuStatic] | None = None
        self._resize_timer: Timer | None = None
        self._head = ""  # the head line as last shown
        self._notice = ""  # why there is no GPU history, when there is none

    @property
    def wanted(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What the user asked for; `loaded` equals it once the charts show it."""
        return self.window, self.metrics, self.host_metrics

    @property
    def following(self) -> bool:
        """Live frames extend what is on screen (the 5-minute window, fetched since the last gap)."""
        return self.window == LIVE_WINDOW and self.loaded == self.wanted and not self._stale

    @property
    def needs_reload(self) -> bool:
        if self.loaded != self.wanted or self._stale or self.loaded_at is None:
            return True
        cadence = REFRESH_S.get(self.window)
        return cadence is not None and self.clock() - self.loaded_at >= cadence

    def compose(self) -> ComposeResult:
        yield Static(id="history-head")
        yield Static(id="history-empty")

    async def set_gpus(self, statics: list[GpuStatic], sampling: str | None) -> None:
        if self._statics is not None and [s.uuid for s in statics] == [s.uuid for s in self._statics]:
            return
        self._statics = sorted(statics, key=lambda s: s.index)
        empty = self.query_one("#history-empty", Static)
        empty.display = not statics
        self._notice = f"No GPU history: {sampling or 'no NVIDIA GPU'}. The host's history is below."
        empty.update(self._notice)
        await self._rebuild()

    async def _rebuild(self) -> None:
        """One block per GPU with a chart per chosen metric, then the host's block."""
        await self.query(HistoryBlock).remove()
        metrics = [METRICS_BY_KEY[k] for k in self.metrics]
        blocks = [
            HistoryBlock(s.uuid, f"GPU {s.index} {s.name}", metrics, "cyan") for s in self._statics or []
        ]
        host = [HOST_METRICS_BY_KEY[k] for k in self.host_metrics]
        blocks.append(HistoryBlock(HOST, "Host", host, "green"))
        await self.mount_all(blocks)
        self.loaded = None
        self._fit_heights()
        self._show_head()

    # -- size ---------------------------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        self._fit_heights()
        self._refit_when_settled()

    def on_chart_resized(self, message: ChartResized) -> None:
        message.stop()
        self._refit_when_settled()

    def _refit_when_settled(self) -> None:
        if self._resize_timer is not None:
            self._resize_timer.stop()
        self._resize_timer = self.set_timer(RESIZE_SETTLE_S, self._after_resize)

    def _after_resize(self) -> None:
        self._resize_timer = None
        if self.loaded is not None and self._points_wanted() != self.loaded_points:
            self.reload()  # more (or fewer) cells: fetch the window at the new resolution

    def _fit_heights(self) -> None:
        """Charts share the pane's height (between MIN_HEIGHT and MAX_HEIGHT rows each)."""
        charts = self._charts()
        height = self.size.height or self.app.size.height - 6
        if not charts or height <= 0:
            return
        blocks = len(list(self.query(HistoryBlock)))
        notice = self._notice_rows() if self.query_one("#history-empty", Static).display else 0
        # The head, the no-GPU notice, each block's title and gap, each chart's label and axis.
        fixed = 2 + notice + 2 * blocks + len(charts) + sum(sc.axis for sc in charts)
        rows = max(MIN_HEIGHT, min(MAX_HEIGHT, (height - fixed) // len(charts)))
        for sc in charts:
            sc.set_plot_height(rows)

    def _notice_rows(self) -> int:
        """The no-GPU notice's lines (it wraps on a narrow terminal) and its gap."""
        width = max(10, (self.size.width or self.app.size.width) - 4)
        return -(-Text(self._notice).cell_len // width) + 1

    def _points_wanted(self) -> int:
        """Two points per cell of the plot: a laid-out chart's own width, else the pane's (which
        may be hidden: then the app's) less the margins, a scrollbar and the axis."""
        sized = [sc.chart.size.width for sc in self._charts() if sc.chart.size.width]
        width = sized[0] - GUTTER if sized else (self.size.width or self.app.size.width) - 4 - GUTTER
        return max(10, width * SAMPLES_PER_CELL)

    # -- loading ----------------------------------------------------------------------------

    def stale(self) -> None:
        """What is on screen may have a gap: the next showing fetches it again."""
        self._stale = True

    def reload(self) -> None:
        """Fetch the window for every GPU and the host (in a thread; the newest request wins)."""
        if self._statics is None:
            return  # not connected yet
        now = self.clock()
        points = self._points_wanted()
        start = now - WINDOW_SECONDS[self.window]
        self._loading = True
        self._show_head()
        uuids = [s.uuid for s in self._statics]
        self._load(self.window, self.metrics, self.host_metrics, uuids, start, now, points)

    @work(thread=True, exclusive=True, exit_on_error=False, group="history")
    def _load(
        self,
        window: str,
        metrics: tuple[str, ...],
        host_metrics: tuple[str, ...],
        uuids: list[str],
        start: float,
        end: float,
        points: int,
    ) -> None:
        series = self.backend.history(uuids, metrics, start, end, points) if uuids else {}
        # Memory's total rides along: it is the ceiling of the memory chart.
        host = self.backend.host_history([*host_metrics, "mem_total"], start, end, points)
        self.post_message(HistoryLoaded(window, metrics, host_metrics, start, end, points, series, host))

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        if (message.window, message.metrics, message.host_metrics) != self.wanted:
            return  # an answer to a request the user has already moved on from
        self._loading = False
        self._stale = False
        self.loaded = self.wanted
        self.loaded_at = message.end
        self.loaded_points = message.points
        self.apply(message.series, message.host, message.start, message.end)

    def apply(self, series: HistorySeries, host: HostSeries, start: float, end: float) -> None:
        statics = {s.uuid: s for s in self._statics or []}
        totals = [p.value for p in host.get("mem_total", []) if p.value]
        self.newest_ts = None
        for block in self.query(HistoryBlock):
            for sc in block.charts:
                if block.key == HOST:
                    points = host.get(sc.metric.key, [])
                    top = {"cpu_percent": 100.0, "mem_used": max(totals) if totals else None}.get(
                        sc.metric.key
                    )
                else:
                    points = series.get(block.key, {}).get(sc.metric.key, [])
                    top = sc.metric.ceiling(statics.get(block.key), None)
                sc.set_points(points)
                sc.chart.set_range(0.0, top)
                newest = next((p.ts for p in reversed(points) if p.value is not None), None)
                if newest is not None:
                    # A bucket's readings reach at most to its end, and never past the fetch.
                    self.step = points[1].ts - points[0].ts if len(points) > 1 else end - start
                    newest = min(end, newest + self.step / 2)
                    self.newest_ts = max(self.newest_ts or newest, newest)
        self._show_axes()
        self._place_cursor()
        self._show_head()

    def _show_axes(self) -> None:
        span = WINDOW_SECONDS[self.window]
        x_labels = [(0.0, ago(span)), (0.5, ago(span / 2)), (1.0, "now")]
        for sc in self._charts():
            values = [p.value for p in sc.points if p.value is not None]
            top = sc.chart.vmax if sc.chart.vmax is not None else max(values, default=None)
            sc.chart.set_axes((sc.metric.short(top), "0"), x_labels if sc.axis else None)

    # -- live --------------------------------------------------------------------------------

    def add_samples(self, snapshots: list[Snapshot], now: float) -> None:
        """Fold live frames into the 5-minute window (others wait for their next fetch)."""
        if not self.following or not snapshots:
            return
        for snap in snapshots:
            if self.newest_ts is not None and snap.ts <= self.newest_ts - self.step:
                continue  # older than what is on screen: a repeated frame
            dropped = 0
            for block in self.query(HistoryBlock):
                for sc in block.charts:
                    dropped = sc.fold(snap.ts, block.reading(snap, sc.metric), self.step)
            if dropped and self.cursor is not None:
                self.cursor = max(0, self.cursor - dropped)  # the cursor stays on its moment
            self.newest_ts = max(self.newest_ts or snap.ts, snap.ts)
        for sc in self._charts():
            sc.chart.replace(p.value for p in sc.points)
        self._show_axes()
        self._place_cursor()
        self._show_head(now)

    def tick(self, now: float, visible: bool) -> None:
        """Once a second: say how old the newest point is; fetch a due window that is shown."""
        if visible and not self._loading and self._statics is not None and self.needs_reload:
            self.reload()
        self._show_head(now)

    # -- text ---------------------------------------------------------------------------------

    def _show_head(self, now: float | None = None) -> None:
        head = Text()
        head.append("window ", style="dim")
        for name, _ in WINDOWS:
            head.append(f" {name} ", style="bold reverse" if name == self.window else "")
        labels = [METRICS_BY_KEY[k].label for k in self.metrics] if self._statics else []
        if labels:
            head.append("  ")
            head.append(", ".join(labels), style="bold")
        head.append("  ")
        if self._loading or self.loaded != self.wanted:
            head.append("loading…", style="yellow")
        elif self.newest_ts is not None:
            age = max(0.0, (now if now is not None else self.clock()) - self.newest_ts)
            late = age > max(3 * self.step, 10.0)
            text = "live" if self.following and not late else f"newest {duration(age)} ago"
            head.append(text, style="bold yellow" if late else "green" if self.following else "dim")
        else:
            head.append("no readings in this window", style="yellow")
        head.truncate(max(10, (self.size.width or self.app.size.width) - 2), overflow="ellipsis")
        if head.markup != self._head:  # once a second: repaint only what changed
            self._head = head.markup
            self.query_one("#history-head", Static).update(head)

    # -- the cursor -------------------------------------------------------------------------

    def _charts(self) -> list[SeriesChart]:
        return [sc for block in self.query(HistoryBlock) for sc in block.charts]

    def _reference(self) -> SeriesChart | None:
        """The chart whose points the cursor indexes: the first one with any."""
        return next((sc for sc in self._charts() if sc.points), None)

    def _place_cursor(self) -> None:
        ref = self._reference()
        ts: float | None = None
        if ref is not None:
            n = len(ref.points)
            if self.cursor is not None and self.cursor >= n:
                self.cursor = None
            ts = ref.points[n - 1 if self.cursor is None else self.cursor].ts
        for sc in self._charts():
            # At the newest point the cursor is not drawn: the charts just follow.
            sc.chart.set_cursor(None if ts is None or self.cursor is None else sc.index_at(ts))
        self._show_values(ts)

    def _show_values(self, ts: float | None) -> None:
        with_date = self.window in ("7d", "30d")
        for block in self.query(HistoryBlock):
            title = Text()
            title.append(block.title_text, style="bold")
            # At the newest point: the time of the newest reading, the one the head's age counts
            # from (the point's own time is its bucket's, up to a bucket older).
            shown = self.newest_ts if self.cursor is None and self.newest_ts is not None else ts
            if shown is not None:
                title.append(f"   ▸ {clock(shown, with_date=with_date)}", style="bold")
                if self.cursor is None:
                    title.append(" (newest)", style="dim")
            block.title.update(title)
            for sc in block.charts:
                sc.label.update(self._label(sc))

    def _label(self, sc: SeriesChart) -> Text:
        """`utilisation  63%   max 100%`: the value at the cursor (the newest reading when the
        cursor is at the newest point) and the largest reading of the window."""
        label = Text()
        label.append(f"{sc.metric.label:<13}", style="dim")
        i = sc.chart.cursor
        value = sc.points[i].value if i is not None and i < len(sc.points) else None
        if self.cursor is None:
            value = next((p.value for p in reversed(sc.points) if p.value is not None), None)
        label.append(sc.metric.show(value), style="bold cyan")
        peaks = [p.peak if p.peak is not None else p.value for p in sc.points]
        present = [v for v in peaks if v is not None]
        if present:
            label.append(f"   max {sc.metric.show(max(present))}", style="dim")
        return label

    # -- actions ----------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        ref = self._reference()
        if ref is None:
            return
        n = len(ref.points)
        self.cursor = max(0, min(n - 1, (n - 1 if self.cursor is None else self.cursor) + delta))
        if self.cursor == n - 1:
            self.cursor = None  # at the right edge the cursor follows the newest point
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
        """Chart `metrics` (CHART_METRICS keys, and host metrics as `host.KEY`, in the order
        given): the GPU ones for every GPU, the host ones in the host's block."""
        gpu = tuple(dict.fromkeys(k for k in metrics if k in METRICS_BY_KEY))
        host = tuple(
            dict.fromkeys(k[5:] for k in metrics if k.startswith("host.") and k[5:] in HOST_METRICS_BY_KEY)
        )
        # A block always charts something: what is left unticked keeps what it had.
        gpu, host = gpu or self.metrics, host or self.host_metrics
        if (gpu, host) == (self.metrics, self.host_metrics):
            return
        self.metrics, self.host_metrics = gpu, host
        await self._rebuild()
        self.reload()
