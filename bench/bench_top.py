"""Cost of the host's heaviest processes (`GET /v1/host/processes`): one scan of every process,
and an answer served from the shared scan. Informational rows: the scan runs only on request."""

from __future__ import annotations

import time
from typing import Any

import psutil

from bench.figures import REPEATS, figure_row, main_for
from gpuwarden.core.telemetry.top import TopReader

SCANS = 20
CACHED = 2000


def _scan_ms() -> float:
    """Wall ms of one full scan (a reader that never shares its scan), top 20 + 20."""
    clock = iter(range(0, 10**9, 10)).__next__  # 10 s between calls: every call scans, measured
    top = TopReader(clock=lambda: float(clock()), every_s=5.0)
    top.heaviest(20)  # the first scan opens every process; later ones reuse the handles
    start = time.perf_counter()
    for _ in range(SCANS):
        top.heaviest(20)
    return (time.perf_counter() - start) / SCANS * 1e3


def _cached_us() -> float:
    top = TopReader(clock=lambda: 0.0)
    top.heaviest(20)
    start = time.perf_counter()
    for _ in range(CACHED):
        top.heaviest(20)
    return (time.perf_counter() - start) / CACHED * 1e6


def run() -> list[dict[str, Any]]:
    processes = len(psutil.pids())
    scans = [_scan_ms() for _ in range(REPEATS)]
    cached = [_cached_us() for _ in range(REPEATS)]
    return [
        figure_row(f"host processes: one scan of {processes} processes, top 20 + 20", scans, "ms wall/scan"),
        figure_row("host processes: an answer from the shared scan", cached, "µs wall/call"),
    ]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
