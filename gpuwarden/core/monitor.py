"""What `gpuwarden monitor` concludes from a series of ticks: a summary per GPU and a verdict.

People judge GPUs by hand ("20 % utilisation", "300 W of 575 W"). Utilisation alone
misleads (it reads 100 % whenever any kernel runs), so the verdict weighs power against the
enforced limit first and utilisation second, and reports throttling with its reasons.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK, GpuSample, HostSample, Tick, throttle_names

# Thresholds for the verdict; named so the reasons can quote them.
UNDERUSED_POWER_PCT = 60.0
UNDERUSED_UTIL_PCT = 70.0
IDLE_UTIL_PCT = 5.0
MEMORY_FULL_PCT = 95.0
THROTTLED_SHARE_PCT = 10.0


@dataclass
class _Series:
    """Running sum/max/count of one metric; None readings are not counted."""

    total: float = 0.0
    peak: float | None = None
    count: int = 0

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.total += value
        self.count += 1
        if self.peak is None or value > self.peak:
            self.peak = value

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class _GpuAccumulator:
    uuid: str
    index: int | None
    name: str | None
    ticks: int = 0
    lost_ticks: int = 0
    util: _Series = field(default_factory=_Series)
    mem_used: _Series = field(default_factory=_Series)
    mem_pct: _Series = field(default_factory=_Series)
    power: _Series = field(default_factory=_Series)
    power_pct: _Series = field(default_factory=_Series)
    temperature: _Series = field(default_factory=_Series)
    mem_total: int | None = None
    power_limit: float | None = None
    energy_j: float = 0.0
    energy_from_counter: bool = True
    last_energy_mj: int | None = None
    last_ts: float | None = None
    last_power: float | None = None
    throttled_s: float = 0.0
    throttle_reason_s: dict[str, float] = field(default_factory=dict)
    observed_s: float = 0.0

    def add(self, s: GpuSample) -> None:
        self.ticks += 1
        if s.lost:
            self.lost_ticks += 1
            return
        util = s.util_gpu_fine if s.util_gpu_fine is not None else s.util_gpu
        self.util.add(util)
        if s.mem_total:
            self.mem_total = s.mem_total
        self.mem_used.add(s.mem_used)
        if s.mem_used is not None and s.mem_total:
            self.mem_pct.add(100.0 * s.mem_used / s.mem_total)
        self.power.add(s.power_w)
        if s.power_limit_w:
            self.power_limit = s.power_limit_w
            if s.power_w is not None:
                self.power_pct.add(100.0 * s.power_w / s.power_limit_w)
        self.temperature.add(s.temperature_c)

        dt = s.ts - self.last_ts if self.last_ts is not None else 0.0
        if dt > 0:
            self.observed_s += dt
            if s.throttle_reasons and s.throttle_reasons & THROTTLE_ACTIVE_MASK:
                self.throttled_s += dt
                for name in throttle_names(s.throttle_reasons & THROTTLE_ACTIVE_MASK):
                    self.throttle_reason_s[name] = self.throttle_reason_s.get(name, 0.0) + dt
        self._add_energy(s, dt)
        self.last_ts = s.ts

    def _add_energy(self, s: GpuSample, dt: float) -> None:
        # Prefer NVML's energy counter (exact); integrate power only on GPUs that lack it.
        if s.energy_mj is not None and self.energy_from_counter:
            if self.last_energy_mj is not None:
                delta = s.energy_mj - self.last_energy_mj
                # A counter that went backwards was reset (driver reload): count from zero.
                self.energy_j += (delta if delta >= 0 else s.energy_mj) / 1000.0
            self.last_energy_mj = s.energy_mj
        else:
            self.energy_from_counter = False
            if dt > 0 and s.power_w is not None and self.last_power is not None:
                self.energy_j += 0.5 * (s.power_w + self.last_power) * dt
        self.last_power = s.power_w


@dataclass
class GpuSummary:
    uuid: str
    index: int | None
    name: str | None
    samples: int
    lost_samples: int
    util_mean: float | None
    util_peak: float | None
    mem_used_mean: float | None
    mem_used_peak: float | None
    mem_total: int | None
    mem_pct_mean: float | None
    mem_pct_peak: float | None
    power_mean_w: float | None
    power_peak_w: float | None
    power_limit_w: float | None
    power_pct_mean: float | None
    temperature_mean_c: float | None
    temperature_peak_c: float | None
    energy_j: float | None
    energy_source: str | None
    throttled_s: float
    throttled_pct: float | None
    throttle_reasons_s: dict[str, float]
    verdict: str
    reasons: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(a: _GpuAccumulator) -> tuple[str, list[str]]:
    """A one-word verdict plus the numbers that justify it."""
    if a.ticks and a.lost_ticks == a.ticks:
        return "lost", ["the GPU stopped answering NVML for the whole window"]
    util, power_pct = a.util.mean, a.power_pct.mean
    if util is not None and util < IDLE_UTIL_PCT:
        return "idle", _levels(util, power_pct)
    underused = _underuse_reasons(a)
    throttled = _throttle_reason(a)
    if throttled is not None:
        return ("underused" if underused else "throttled"), [*underused, throttled]
    memory_full = _memory_full_reasons(a)
    if underused:
        return "underused", underused + memory_full
    if util is None and power_pct is None:
        return "unknown", ["this GPU reports neither utilisation nor power"]
    return "good", _levels(util, power_pct) + memory_full


def _levels(util: float | None, power_pct: float | None) -> list[str]:
    """Utilisation and power as they read, each where the GPU reports it."""
    levels = []
    if util is not None:
        levels.append(f"utilisation {util:.0f} %")
    if power_pct is not None:
        levels.append(f"power {power_pct:.0f} % of limit")
    return levels


def _underuse_reasons(a: _GpuAccumulator) -> list[str]:
    """Power and utilisation below their bounds, with the memory in use (empty when neither is)."""
    util, power_pct, mem_pct = a.util.mean, a.power_pct.mean, a.mem_pct.mean
    reasons = []
    if power_pct is not None and power_pct < UNDERUSED_POWER_PCT:
        reasons.append(f"power {power_pct:.0f} % of limit")
    if util is not None and util < UNDERUSED_UTIL_PCT:
        reasons.append(f"utilisation {util:.0f} %")
    if reasons and mem_pct is not None:
        reasons.append(f"memory {mem_pct:.0f} % used")
    return reasons


def _throttle_reason(a: _GpuAccumulator) -> str | None:
    """The share of time throttled and its two main reasons, when that share is worth a verdict."""
    throttled_pct = 100.0 * a.throttled_s / a.observed_s if a.observed_s else 0.0
    if throttled_pct < THROTTLED_SHARE_PCT:
        return None
    top = sorted(a.throttle_reason_s.items(), key=lambda kv: -kv[1])
    why = ", ".join(name for name, _ in top[:2])
    return f"throttled {throttled_pct:.0f} % of the time ({why})"


def _memory_full_reasons(a: _GpuAccumulator) -> list[str]:
    if a.mem_pct.peak is None or a.mem_pct.peak < MEMORY_FULL_PCT:
        return []
    return [f"memory peaked at {a.mem_pct.peak:.0f} % (close to out of memory)"]


@dataclass
class HostSummary:
    samples: int
    cpu_mean: float | None
    cpu_peak: float | None
    mem_used_mean: float | None
    mem_used_peak: float | None
    mem_total: int | None
    load1_mean: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SummaryAccumulator:
    """Feed ticks in order; `summary()` may be called at any time (e.g. on Ctrl-C)."""

    def __init__(self, names: dict[str, tuple[int, str]] | None = None) -> None:
        self._names = names or {}
        self._gpus: dict[str, _GpuAccumulator] = {}
        self._host_cpu = _Series()
        self._host_mem = _Series()
        self._host_load = _Series()
        self._host_mem_total: int | None = None
        self._host_samples = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    def add(self, tick: Tick) -> None:
        if self.first_ts is None:
            self.first_ts = tick.ts
        self.last_ts = tick.ts
        for s in tick.gpus:
            acc = self._gpus.get(s.uuid)
            if acc is None:
                index, name = self._names.get(s.uuid, (None, None))
                acc = self._gpus[s.uuid] = _GpuAccumulator(uuid=s.uuid, index=index, name=name)
            acc.add(s)
        if tick.host is not None:
            self._add_host(tick.host)

    def _add_host(self, h: HostSample) -> None:
        self._host_samples += 1
        self._host_cpu.add(h.cpu_percent)
        self._host_mem.add(h.mem_used)
        self._host_load.add(h.load1)
        if h.mem_total:
            self._host_mem_total = h.mem_total

    def summary(self) -> dict[str, Any]:
        """Per-GPU summaries with verdicts, the host summary, and the window length."""
        gpus = []
        for a in sorted(self._gpus.values(), key=lambda x: (x.index is None, x.index, x.uuid)):
            verdict, reasons = _verdict(a)
            gpus.append(
                GpuSummary(
                    uuid=a.uuid,
                    index=a.index,
                    name=a.name,
                    samples=a.ticks,
                    lost_samples=a.lost_ticks,
                    util_mean=a.util.mean,
                    util_peak=a.util.peak,
                    mem_used_mean=a.mem_used.mean,
                    mem_used_peak=a.mem_used.peak,
                    mem_total=a.mem_total,
                    mem_pct_mean=a.mem_pct.mean,
                    mem_pct_peak=a.mem_pct.peak,
                    power_mean_w=a.power.mean,
                    power_peak_w=a.power.peak,
                    power_limit_w=a.power_limit,
                    power_pct_mean=a.power_pct.mean,
                    temperature_mean_c=a.temperature.mean,
                    temperature_peak_c=a.temperature.peak,
                    energy_j=a.energy_j if (a.last_energy_mj is not None or a.power.count > 1) else None,
                    energy_source=("counter" if a.energy_from_counter else "power integral")
                    if (a.last_energy_mj is not None or a.power.count > 1)
                    else None,
                    throttled_s=a.throttled_s,
                    throttled_pct=100.0 * a.throttled_s / a.observed_s if a.observed_s else None,
                    throttle_reasons_s=dict(a.throttle_reason_s),
                    verdict=verdict,
                    reasons=reasons,
                ).to_dict()
            )
        host = HostSummary(
            samples=self._host_samples,
            cpu_mean=self._host_cpu.mean,
            cpu_peak=self._host_cpu.peak,
            mem_used_mean=self._host_mem.mean,
            mem_used_peak=self._host_mem.peak,
            mem_total=self._host_mem_total,
            load1_mean=self._host_load.mean,
        ).to_dict()
        duration = (self.last_ts - self.first_ts) if self.first_ts is not None and self.last_ts else 0.0
        return {"duration_s": duration, "gpus": gpus, "host": host}
