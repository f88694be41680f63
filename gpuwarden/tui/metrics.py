"""The GPU metrics the dashboard charts, with their units and the ceiling of each chart."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.core.telemetry.types import GpuSample, GpuStatic
from gpuwarden.core.units import GIB, size


@dataclass(frozen=True)
class ChartMetric:
    key: str  # a GPU_METRICS name: what history() and GpuSample call it
    label: str
    unit: str
    scale: float = 1.0  # raw value / scale = displayed value
    digits: int = 0

    def show(self, raw: float | None) -> str:
        if raw is None:
            return "–"
        return f"{raw / self.scale:.{self.digits}f}{self.unit}"

    def short(self, raw: float | None) -> str:
        """At most 7 cells, for a chart's axis: 100%, 80 GiB, 700W, 1980MHz."""
        if raw is None:
            return ""
        if self.scale == GIB:
            return size(raw)
        return f"{raw / self.scale:.0f}{self.unit.strip()}"

    def value(self, sample: GpuSample) -> float | None:
        if sample.lost:
            return None
        raw = getattr(sample, self.key)
        return None if raw is None else float(raw)

    def ceiling(self, static: GpuStatic | None, sample: GpuSample | None) -> float | None:
        """The top of the chart: the card's capacity where one exists, so a full bar means full."""
        if self.key in ("util_gpu", "util_mem"):
            return 100.0
        if self.key == "mem_used":
            if sample is not None and sample.mem_total:
                return float(sample.mem_total)
            return float(static.memory_total) if static and static.memory_total else None
        if self.key == "power_w":
            if sample is not None and sample.power_limit_w:
                return sample.power_limit_w
            return static.power_limit_max_w if static else None
        if self.key == "temperature_c":
            return 100.0
        if self.key == "sm_clock_mhz":
            return float(static.max_sm_clock_mhz) if static and static.max_sm_clock_mhz else None
        if self.key == "mem_clock_mhz":
            return float(static.max_mem_clock_mhz) if static and static.max_mem_clock_mhz else None
        return None


CHART_METRICS: tuple[ChartMetric, ...] = (
    ChartMetric("util_gpu", "utilisation", "%"),
    ChartMetric("mem_used", "memory", " GiB", scale=GIB, digits=1),
    ChartMetric("power_w", "power", " W"),
    ChartMetric("temperature_c", "temperature", "°C"),
    ChartMetric("sm_clock_mhz", "SM clock", " MHz"),
    ChartMetric("mem_clock_mhz", "memory clock", " MHz"),
)
METRICS_BY_KEY = {m.key: m for m in CHART_METRICS}


def next_metric(current: str, step: int = 1) -> str:
    keys = [m.key for m in CHART_METRICS]
    return keys[(keys.index(current) + step) % len(keys)] if current in keys else keys[0]


# The host's charts in the history tab (HOST_METRICS names); memory's ceiling is the host's total.
HOST_CHART_METRICS: tuple[ChartMetric, ...] = (
    ChartMetric("cpu_percent", "CPU", "%"),
    ChartMetric("mem_used", "memory", " GiB", scale=GIB, digits=1),
    ChartMetric("load1", "load (1 min)", "", digits=2),
    ChartMetric("swap_used", "swap", " GiB", scale=GIB, digits=1),
)
HOST_METRICS_BY_KEY = {m.key: m for m in HOST_CHART_METRICS}
