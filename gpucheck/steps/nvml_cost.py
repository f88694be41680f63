"""NVML cost: CPU time of one sampler tick on the real driver, side by side in one run with what
other tools spend for a snapshot of the same GPUs: `nvidia-smi --query-gpu` (a process per
snapshot, so its CPU is the child's), and nvitop's and gpustat's Python APIs where importable.

Our tick is the daemon's: every GPU reading (energy, power and the power limit batched into one
nvmlDeviceGetFieldValues call where the driver has the fields; utilisation samples asked since the
last timestamp seen), the host, and processes + PCIe every fifth tick (the default 5 s at 1 Hz).
Each NVML call is also timed alone, the batched call and the samples since the last timestamp
included, to say where a tick's CPU goes.
Target: ≤ 1 ms of CPU per tick.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.figures import REPEATS, figure_row
from gpucheck.result import StepResult

TICKS = 200
SMI_CALLS = 10
TARGET_US = 1000.0
SMI_FIELDS = (
    "utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,enforced.power.limit,"
    "temperature.gpu,clocks.sm,clocks.mem,pstate,fan.speed"
)


def _cpu_us(fn: Callable[[], Any], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def _ours() -> tuple[list[float], list[float], int]:
    from gpuwarden.core.telemetry.host import HostReader
    from gpuwarden.core.telemetry.nvml import open_gpu_reader
    from gpuwarden.core.telemetry.sampler import Sampler

    reader = open_gpu_reader()
    now = [time.time()]
    sampler = Sampler(reader, HostReader(), process_interval=5.0, clock=lambda: now[0])

    def tick() -> None:
        now[0] += 1.0  # 1 Hz as the daemon samples: processes and PCIe every fifth tick
        sampler.tick()

    try:
        for _ in range(10):
            tick()  # capability probing and psutil's first readings stay out of the figure
        ticks = [_cpu_us(tick, TICKS) for _ in range(REPEATS)]
        gpu_only = [_cpu_us(lambda: reader.sample(time.time()), TICKS) for _ in range(REPEATS)]
        count = len(reader.gpus())
    finally:
        reader.close()
    return ticks, gpu_only, count


# The NVML calls of one tick (and of the slower every-fifth-tick readings), each timed alone on
# GPU 0, to say where a tick's CPU goes.
_CALLS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("nvmlDeviceGetUtilizationRates", ()),
    ("nvmlDeviceGetSamples", (1, 0)),
    ("nvmlDeviceGetMemoryInfo", ()),
    ("nvmlDeviceGetPowerUsage", ()),
    ("nvmlDeviceGetEnforcedPowerLimit", ()),
    ("nvmlDeviceGetTotalEnergyConsumption", ()),
    ("nvmlDeviceGetTemperature", (0,)),
    ("nvmlDeviceGetClockInfo", (1,)),
    ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("nvmlDeviceGetPerformanceState", ()),
    ("nvmlDeviceGetComputeRunningProcesses", ()),
    ("nvmlDeviceGetPcieThroughput", (0,)),
)


def _per_call() -> list[dict[str, Any]]:
    """CPU µs of each NVML call alone (median of `REPEATS` rounds)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        rows = []
        for name, args in _CALLS:
            fn = getattr(pynvml, name, None)
            if fn is None:
                continue

            def call(fn: Callable[..., Any] = fn, args: tuple[Any, ...] = args) -> None:
                with contextlib.suppress(pynvml.NVMLError):  # NotSupported costs a call too
                    fn(handle, *args)

            rows.append(figure_row(f"  {name}", [_cpu_us(call, 50) for _ in range(REPEATS)], "µs CPU"))
        return rows + _batched_calls(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()


def _batched_calls(pynvml: Any, handle: Any) -> list[dict[str, Any]]:
    """CPU µs of what a tick calls now instead: the field values the reader batches (one call),
    and the utilisation samples asked only since the newest timestamp seen."""
    from gpuwarden.core.telemetry.nvml import FIELD_IDS

    ids = list(FIELD_IDS.values())
    last = [0]

    def fields() -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlDeviceGetFieldValues(handle, ids)

    def samples_since_last() -> None:
        with contextlib.suppress(pynvml.NVMLError):  # NotFound: nothing new since `last`
            _, got = pynvml.nvmlDeviceGetSamples(handle, 1, last[0])
            if got:
                last[0] = max(s.timeStamp for s in got)

    samples_since_last()
    return [
        figure_row(
            f"  nvmlDeviceGetFieldValues ({len(ids)} fields: {', '.join(FIELD_IDS)})",
            [_cpu_us(fields, 50) for _ in range(REPEATS)],
            "µs CPU",
        ),
        figure_row(
            "  nvmlDeviceGetSamples since the last timestamp seen",
            [_cpu_us(samples_since_last, 50) for _ in range(REPEATS)],
            "µs CPU",
        ),
    ]


def _smi() -> tuple[list[float], list[float]]:
    """(child CPU µs, wall µs) per `nvidia-smi --query-gpu` call."""
    cpu, wall = [], []
    argv = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        for _ in range(SMI_CALLS):
            subprocess.run(argv, capture_output=True, check=True, timeout=60)
        wall.append((time.perf_counter() - start) / SMI_CALLS * 1e6)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        cpu.append(used / SMI_CALLS * 1e6)
    return cpu, wall


def _peer(name: str) -> tuple[list[float] | None, str]:
    """CPU µs per snapshot through nvitop's or gpustat's API; None and why when not importable."""
    try:
        if name == "nvitop":
            from nvitop import Device

            devices = Device.all()

            def snap() -> None:
                for d in devices:
                    d.as_snapshot()

        else:
            import gpustat

            def snap() -> None:
                gpustat.new_query()

        snap()
        return [_cpu_us(snap, TICKS // 4) for _ in range(REPEATS)], ""
    except ImportError as exc:
        return None, f"{name} is not importable here ({exc})"


def run(name: str) -> StepResult:
    ticks, gpu_only, gpus = _ours()
    smi_cpu, smi_wall = _smi()
    rows = [
        figure_row(
            f"gpuwarden sampler tick, {gpus} GPU(s) + host (processes/PCIe every 5th)",
            ticks,
            "µs CPU",
            target=f"≤ {TARGET_US:.0f}",
            check=lambda v: v <= TARGET_US,
        ),
        figure_row(f"  its GPU reads alone ({gpus} GPU(s))", gpu_only, "µs CPU"),
        *_per_call(),
        figure_row("nvidia-smi --query-gpu, one snapshot (the child's CPU)", smi_cpu, "µs CPU"),
        figure_row("  its wall time", smi_wall, "µs wall"),
    ]
    notes = []
    for peer in ("nvitop", "gpustat"):
        values, why = _peer(peer)
        if values is None:
            notes.append(why)
        else:
            rows.append(figure_row(f"{peer} snapshot of every GPU (its Python API)", values, "µs CPU"))
    summary = (
        f"our tick {statistics.median(ticks):.0f} µs CPU vs nvidia-smi {statistics.median(smi_cpu):.0f} µs"
    )
    return StepResult.from_rows(name, rows, summary, notes)
