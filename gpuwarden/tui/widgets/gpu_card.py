"""One GPU at a glance: utilisation, memory, power against its limit, temperature, clocks,
throttle reasons while active, energy since the view opened, and a live chart."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK, throttle_names
from gpuwarden.core.units import energy, gib, num
from gpuwarden.tui.formatting import bar
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


class GpuCard(Vertical):
    """Text lines on top of a chart; `show()` redraws from the GPU's live state."""

    DEFAULT_CSS = """
    GpuCard {
        height: 5;
        padding: 0 1;
        margin-bottom: 1;
        border-left: thick $accent;
    }
    GpuCard .gpu-text { height: 3; }
    GpuCard Chart { height: 2; }
    GpuCard.lost { border-left: thick $error; }
    """

    def __init__(self, uuid: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.uuid = uuid
        self.text = Static(classes="gpu-text")
        self.chart = Chart(height=2, style="green")

    def compose(self) -> ComposeResult:
        yield self.text
        yield self.chart

    def show(self, state: GpuState, metric: ChartMetric, width: int) -> None:
        """Redraw for `state`; `width` is the card's text width (bars scale with it)."""
        sample, static = state.latest, state.static
        head = Text()
        head.append(f"GPU {static.index} ", style="bold")
        head.append(static.name, style="bold")
        self.set_class(bool(sample and sample.lost), "lost")
        if sample is None or sample.lost:
            head.append("  LOST: not answering NVML" if sample else "  waiting for a sample", style=_HOT)
            self.text.update(head)
            self.chart.replace(state.series[metric.key])
            return
        active = (sample.throttle_reasons or 0) & THROTTLE_ACTIVE_MASK
        badges = Text()
        for name in throttle_names(active):
            badges.append(" ")
            badges.append(f" {name.upper()} ", style="bold white on red")
        head.append(" ")
        head.append_text(badges)
        chart_label = f"chart: {metric.label}"
        room = width - head.cell_len
        if room > len(chart_label):
            head.append(" " * (room - len(chart_label)) + chart_label, style="dim")
        bar_width = max(6, (width - 44) // 2)

        util_fraction = None if sample.util_gpu is None else sample.util_gpu / 100
        mem_fraction = (
            sample.mem_used / sample.mem_total if sample.mem_used is not None and sample.mem_total else None
        )
        line2 = Text()
        line2.append(f"util {num(sample.util_gpu, '>3.0f', '%')} ")
        line2.append(bar(util_fraction, bar_width), style=_level_style(util_fraction))
        line2.append(f"  mem {gib(sample.mem_used)}/{gib(sample.mem_total)} GiB ")
        line2.append(bar(mem_fraction, bar_width), style=_level_style(mem_fraction))

        line3 = Text()
        if sample.power_w is not None and sample.power_limit_w:
            power_fraction = sample.power_w / sample.power_limit_w
            line3.append(f"power {sample.power_w:.0f}/{sample.power_limit_w:.0f} W ")
            line3.append(f"({100 * power_fraction:.0f}%)", style=_level_style(power_fraction))
        else:
            line3.append(f"power {num(sample.power_w, '.0f', ' W')}")
        temp = sample.temperature_c
        line3.append("  ")
        line3.append(num(temp, ".0f", "°C"), style=_HOT if temp is not None and temp >= 85 else "")
        line3.append(f"  SM {num(sample.sm_clock_mhz, 'd')} MHz  mem {num(sample.mem_clock_mhz, 'd')} MHz")
        line3.append(f"  energy {energy(state.energy.joules)}", style="dim")

        self.text.update(Text("\n").join([head, line2, line3]))
        self.chart.set_range(0.0, metric.ceiling(static, sample))
        self.chart.replace(state.series[metric.key])
