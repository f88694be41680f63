"""Host readings through psutil."""

from __future__ import annotations

import os

import psutil

from gpuwarden.core.telemetry.host import MIN_CPU_SPAN_S, HostReader, ProcessEnricher
from gpuwarden.core.telemetry.types import GpuProcess


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_host_sample_has_plausible_values() -> None:
    clock = Clock()
    reader = HostReader(clock)
    clock.now += MIN_CPU_SPAN_S
    s = reader.sample(12.5)
    vm = psutil.virtual_memory()
    assert s.ts == 12.5
    assert s.mem_total == vm.total
    assert s.mem_used is not None and 0 < s.mem_used <= vm.total
    assert s.cpu_percent is not None and 0.0 <= s.cpu_percent <= 100.0
    assert s.load1 is not None and s.load1 >= 0.0 and s.load15 is not None
    assert s.swap_used is not None and s.swap_used >= 0


def test_a_reading_right_after_the_baseline_is_unknown_not_zero() -> None:
    """A daemon's first tick comes milliseconds after the baseline: psutil's 0 % then is rounding
    (every daemon start stored one, and history showed a minimum of 0 % on a loaded machine)."""
    clock = Clock()
    reader = HostReader(clock)
    assert reader.sample(1.0).cpu_percent is None
    clock.now += MIN_CPU_SPAN_S
    assert reader.sample(2.0).cpu_percent is not None
    assert reader.sample(2.1).cpu_percent is None  # too soon after that reading again


def test_enricher_dedups_pids_and_measures_cpu_from_the_second_call() -> None:
    enrich = ProcessEnricher()
    rows = [GpuProcess(ts=1.0, uuid=f"GPU-{i}", pid=os.getpid(), used_memory=1) for i in range(2)]
    enrich(rows)
    assert rows[0].name == rows[1].name == psutil.Process().name()
    assert rows[0].rss is not None and rows[0].rss > 0
    assert rows[0].cpu_percent is None and rows[1].cpu_percent is None
    again = [GpuProcess(ts=2.0, uuid="GPU-0", pid=os.getpid(), used_memory=1)]
    enrich(again)
    assert again[0].cpu_percent is not None


def test_enricher_tolerates_vanished_pids() -> None:
    enrich = ProcessEnricher()
    rows = [GpuProcess(ts=1.0, uuid="GPU-0", pid=2**22 + 12345, used_memory=None)]
    enrich(rows)
    assert (rows[0].name, rows[0].cmdline, rows[0].user, rows[0].cpu_percent, rows[0].rss) == (None,) * 5


def test_each_core_is_read_and_the_host_share_is_their_mean() -> None:
    clock = Clock()
    reader = HostReader(clock)
    assert reader.sample(1.0).cpu_cores is None  # too soon after the baseline, as the total
    clock.now += MIN_CPU_SPAN_S
    s = reader.sample(2.0)
    assert s.cpu_cores is not None and len(s.cpu_cores) == psutil.cpu_count()
    assert all(0.0 <= c <= 100.0 for c in s.cpu_cores)
    assert s.cpu_percent == round(sum(s.cpu_cores) / len(s.cpu_cores), 1)
    assert s.swap_total is not None and s.swap_total >= (s.swap_used or 0)
