"""One GPU at a glance: utilisation, memory, power against its limit, temperature, clocks,
throttle reasons while active, energy since the view opened, and a live chart."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK, throttle_names
from gpuwarden.core.units import energy, gib, num
from gpuwarden.tui.formatting import bar, first_that_fit
from gpuwarden.tui.live import GpuState
from gpuwarden.tui.metrics import ChartMetric
from gpuwarden.tui.widgets.chart import Chart

# Warn colours: readable on 256-colour terminals and on dark and light themes alike.
_HOT = "bold red"
_WARM = "yellow"


def _level_style(fraction: float | None) -> str:
    if fraction is None:
        return "dim"
    return _HOT if fraction >= 0.95 else _WARM if fraction >= 0.8 else "green"


class CardText(Static):
    """The card's three lines, laid out when drawn, at the width the widget has then: the width a
    caller knows before layout is a guess, and a line one cell too wide wraps the last one away."""

    def __init__(self) -> None:
        super().__init__(classes="gpu-text")
        self.shown: tuple[GpuState, ChartMetric, int] | None = None

    def render(self) -> Text:
        if self.shown is None:
            return Text()
        state, metric, hint = self.shown
        return card_lines(state, metric, self.content_size.width or hint)


class GpuCard(Vertical):
    """Text lines on top of a chart; `show()` redraws from the GPU's live state."""

    DEFAULT_CSS = """
    GpuCard {
        height: 5;
        padding: 0 1;
        margin-bottom: 1;
        border-left: thick $accent;
    }
    GpuCard .gpu-text { height: 3; text-wrap: nowrap; text-overflow: ellipsis; }
    GpuCard Chart { height: 2; }
    GpuCard.lost { border-left: thick $error; }
    """

    def __init__(self, uuid: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.uuid = uuid
        self.text = CardText()
        self.chart = Chart(height=2, style="green")

    def compose(self) -> ComposeResult:
        yield self.text
        yield self.chart

    def show(self, state: GpuState, metric: ChartMetric, width: int) -> None:
        """Redraw for `state`; `width` is the card's text width until the card is laid out."""
        sample = state.latest
        self.set_class(bool(sample and sample.lost), "lost")
        self.text.shown = (state, metric, width)
        self.text.refresh()
        if sample is not None and not sample.lost:
            self.chart.set_range(0.0, metric.ceiling(state.static, sample))
        self.chart.replace(state.series[metric.key])


def card_lines(state: GpuState, metric: ChartMetric, width: int) -> Text:
    """GPU and throttle badges; utilisation and memory with bars; power, temperature, clocks and
    energy, the last dropped first where the width is short."""
    sample, static = state.latest, state.static
    if sample is None or sample.lost:
        head = Text(f"GPU {static.index} {static.name}", style="bold")
        head.append("  LOST: not answering NVML" if sample else "  waiting for a sample", style=_HOT)
        return _cropped([head])
    head = _header(static.index, static.name, sample.throttle_reasons or 0, f"chart: {metric.label}", width)

    util_fraction = None if sample.util_gpu is None else sample.util_gpu / 100
    mem_fraction = (
        sample.mem_used / sample.mem_total if sample.mem_used is not None and sample.mem_total else None
    )
    util = f"util {num(sample.util_gpu, '>3.0f', '%')} "
    memory = f"  mem {gib(sample.mem_used)}/{gib(sample.mem_total)} GiB "
    bar_width = min(max(6, (width - 44) // 2), max(2, (width - len(util) - len(memory)) // 2))
    line2 = Text(util)
    line2.append(bar(util_fraction, bar_width), style=_level_style(util_fraction))
    line2.append(memory)
    line2.append(bar(mem_fraction, bar_width), style=_level_style(mem_fraction))

    power = Text(f"power {num(sample.power_w, '.0f', ' W')}")
    if sample.power_w is not None and sample.power_limit_w:
        power_fraction = sample.power_w / sample.power_limit_w
        power = Text(f"power {sample.power_w:.0f}/{sample.power_limit_w:.0f} W ")
        power.append(f"({100 * power_fraction:.0f}%)", style=_level_style(power_fraction))
    temp = sample.temperature_c
    hot = temp is not None and temp >= 85
    line3 = first_that_fit(
        [
            power,
            Text(num(temp, ".0f", "°C"), style=_HOT if hot else ""),
            Text(f"SM {num(sample.sm_clock_mhz, 'd')} MHz"),
            Text(f"mem {num(sample.mem_clock_mhz, 'd')} MHz"),
            Text(f"energy {energy(state.energy.joules)}", style="dim"),
        ],
        width,
    )
    return _cropped([head, line2, line3])


def _header(index: int, name: str, throttle_reasons: int, chart_label: str, width: int) -> Text:
    """`GPU 0 <name> <badges>`, the chart's name right-aligned where it fits; a long name is
    shortened before a badge is, since the badges say why the GPU is slow."""
    badges = Text()
    for reason in throttle_names(throttle_reasons & THROTTLE_ACTIVE_MASK):
        badges.append(" ")
        badges.append(f" {reason.upper()} ", style="bold white on red")
    label = f"GPU {index} "
    room_for_name = max(8, width - len(label) - badges.cell_len - 1)
    shown_name = Text(name, style="bold")
    shown_name.truncate(room_for_name, overflow="ellipsis")
    head = Text(label, style="bold")
    head.append_text(shown_name)
    head.append(" ")
    head.append_text(badges)
    room = width - head.cell_len
    if room > len(chart_label):
        head.append(" " * (room - len(chart_label)) + chart_label, style="dim")
    return head


def _cropped(lines: list[Text]) -> Text:
    """The card's lines, each cut at the edge: a wrapped line would push the last out of the card."""
    text = Text("\n").join(lines)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text
