"""NVML calls and reader CPU per GPU per tick, getters alone (before) vs. batched field values.

"before" is a driver without nvmlDeviceGetFieldValues, so the reader takes today's getter for
every reading; "after" reads energy, power and the power limit in one field-values call. The
fake's calls cost what Python costs, not what the driver costs: the call count is the figure that
carries to hardware (the GPU check's `nvml-cost` step times the driver).
"""

from __future__ import annotations

import time
from typing import Any

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.types import GpuProcess

GPUS = 8
TICKS = 500


def _no_enrich(rows: list[GpuProcess]) -> None:
    """Processes are not read per tick."""


def _reader(batched: bool) -> tuple[FakeNvml, NvmlReader]:
    fake = FakeNvml(f"h100x{GPUS}")
    if not batched:
        # As a driver that predates field values answers: FunctionNotFound.
        fake._missing = fake._missing | {"nvmlDeviceGetFieldValues"}
    return fake, NvmlReader(fake, enrich=_no_enrich)


def _measure(batched: bool) -> tuple[float, float]:
    """(NVML calls per GPU per tick, µs of CPU per GPU per tick) over `TICKS` ticks."""
    fake, reader = _reader(batched)
    for _ in range(20):
        fake.advance(1.0)
        reader.sample(fake.time)
    calls_before = sum(fake.calls.values())
    start = time.process_time()
    for _ in range(TICKS):
        fake.advance(1.0)
        reader.sample(fake.time)
    cpu = time.process_time() - start
    calls = sum(fake.calls.values()) - calls_before
    reader.close()
    return calls / TICKS / GPUS, cpu / TICKS / GPUS * 1e6


def run() -> list[dict[str, Any]]:
    """Rows for `python -m bench nvml_calls`: before/after, `REPEATS` interleaved runs each."""
    calls: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(REPEATS):
        for batched in (False, True):
            n, us = _measure(batched)
            calls[batched].append(n)
            cpu[batched].append(us)
    rows = []
    for batched, label in ((False, "getters only (before)"), (True, "field values (after)")):
        rows.append(figure_row(f"NVML calls per GPU per tick, {label}", calls[batched], "calls"))
        rows.append(figure_row(f"reader + fake per GPU per tick, {label}", cpu[batched], "µs CPU/GPU/tick"))
    return rows


if __name__ == "__main__":
    raise SystemExit(main_for(run))
