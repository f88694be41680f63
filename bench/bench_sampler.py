"""CPU cost of one sampler tick on an 8-GPU fake node (target: ≤ 1 ms of our own CPU per tick)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pynvml

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.host import HostReader
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.sampler import Sampler

TICKS = 1000
TARGET_US = 1000.0


def _cpu_us_per_call(fn: Callable[[], Any], fake: FakeNvml, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fake.advance(1.0)
        fn()
    return (time.process_time() - start) / n * 1e6


def _fake_calls_per_tick(fake: FakeNvml) -> Callable[[], None]:
    """The fake's own work: the same NVML calls a tick makes, without the reader around them."""
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(fake.gpu_count)]
    last = [0] * len(handles)

    def run() -> None:
        for i, h in enumerate(handles):
            fake.nvmlDeviceGetUtilizationRates(h)
            try:
                _, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last[i])
                last[i] = samples[-1].timeStamp
            except fake.NVMLError:
                pass
            fake.nvmlDeviceGetMemoryInfo(h, version=fake.nvmlMemory_v2)
            fake.nvmlDeviceGetPowerUsage(h)
            fake.nvmlDeviceGetEnforcedPowerLimit(h)
            fake.nvmlDeviceGetTotalEnergyConsumption(h)
            fake.nvmlDeviceGetTemperature(h, 0)
            fake.nvmlDeviceGetClockInfo(h, 1)
            fake.nvmlDeviceGetClockInfo(h, 2)
            fake.nvmlDeviceGetCurrentClocksEventReasons(h)
            fake.nvmlDeviceGetFanSpeed(h)
            fake.nvmlDeviceGetPerformanceState(h)

    return run


def run() -> list[dict[str, Any]]:
    """Measure per-tick process CPU time, `REPEATS` times interleaved; rows for `python -m bench`."""
    fake = FakeNvml("h100x8")
    for index in range(fake.gpu_count):
        fake.add_process(index, os.getpid(), 1024**3)
    reader = NvmlReader(fake)
    host = HostReader()
    sampler = Sampler(reader, host, process_interval=5.0, clock=lambda: fake.time)
    for _ in range(50):  # warm caches and psutil's per-process state
        fake.advance(1.0)
        sampler.tick()
    total, gpus, host_only, fake_only = [], [], [], []
    fake_calls = _fake_calls_per_tick(fake)
    for _ in range(REPEATS):
        total.append(_cpu_us_per_call(sampler.tick, fake, TICKS))
        gpus.append(_cpu_us_per_call(lambda: reader.sample(fake.time), fake, TICKS))
        host_only.append(_cpu_us_per_call(lambda: host.sample(fake.time), fake, TICKS))
        fake_only.append(_cpu_us_per_call(fake_calls, fake, TICKS))
    ours = [t - f for t, f in zip(total, fake_only, strict=True)]
    reader.close()
    unit = "µs CPU/tick"
    return [
        *_real_nvml_rows(),
        figure_row("sampler tick, 8 fake GPUs (all: reader + fake + host + processes/5 s)", total, unit),
        figure_row(
            "sampler tick, 8 fake GPUs, our code (all minus the fake's own calls)",
            ours,
            unit,
            target="≤ 1000",
            check=lambda v: v <= TARGET_US,
        ),
        figure_row("  GPU reader alone incl. fake (8 GPUs)", gpus, unit),
        figure_row("  fake NVML calls alone (8 GPUs)", fake_only, unit),
        figure_row("  host reader alone (psutil)", host_only, unit),
    ]


def _real_nvml_rows(ticks: int = 200) -> list[dict[str, Any]]:
    """On a machine with a driver: wall time of one real `sample()` over every GPU, and of the
    (slow) process read. Nothing here without one."""
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    if os.environ.get("GPUWARDEN_FAKE_NVML"):
        return []  # that would time the fake, not the driver
    reader = open_gpu_reader()
    try:
        if reader.status is not None or not reader.gpus():
            return []
        n = len(reader.gpus())
        reader.sample(time.time())  # the first call probes what each GPU supports
        per_tick, per_scan = [], []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(ticks):
                reader.sample(time.time())
            per_tick.append((time.perf_counter() - start) / ticks * 1e6)
            start = time.perf_counter()
            for _ in range(10):
                reader.processes(time.time())
            per_scan.append((time.perf_counter() - start) / 10 * 1e6)
    finally:
        reader.close()
    return [
        figure_row(f"real NVML sample(), {n} GPU(s)", per_tick, "µs wall/tick"),
        figure_row(f"real NVML processes(), {n} GPU(s)", per_scan, "µs wall/scan"),
    ]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
