"""What the daemon keeps resident: RSS after start and after a minute at 1 Hz (fake NVML, 1 GPU
and 8 GPUs), and what makes it up — modules imported, the imports that cost most time, the
allocations still held (tracemalloc), threads.

Target: ≤ 80 MB resident. The daemons of one row run side by side (RSS does not depend on the
machine's load; `bench daemon` times CPU, one daemon at a time). `BENCH_DAEMON_MEMORY_S` sets
the minute (60 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.bench_daemon import REPO, DaemonNode
from bench.figures import REPEATS, figure_row, main_for

SETTLE_S = 3.0  # first process scan done, imports settled


def _minute() -> float:
    try:
        return max(5.0, float(os.environ.get("BENCH_DAEMON_MEMORY_S", "60")))
    except ValueError:
        return 60.0


def resident(root: Path, fake: str, label: str, seconds: float) -> list[dict[str, Any]]:
    """RSS after start and after `seconds` at 1 Hz, `REPEATS` daemons side by side."""
    nodes = [DaemonNode(root / f"{fake}-{rep}", fake, 1.0) for rep in range(REPEATS)]
    try:
        for node in nodes:
            node.start()
        procs = [psutil.Process(node.pid()) for node in nodes]
        time.sleep(SETTLE_S)
        first = [p.memory_info().rss / 1e6 for p in procs]
        time.sleep(seconds)
        last = [p.memory_info().rss / 1e6 for p in procs]
    finally:
        for node in nodes:
            node.stop()
    return [
        figure_row(f"daemon RSS after start, {label}", first, "MB", target="≤ 80", check=lambda v: v <= 80),
        figure_row(
            f"daemon RSS after {seconds:.0f} s at 1 Hz, {label}",
            last,
            "MB",
            target="≤ 80",
            check=lambda v: v <= 80,
        ),
        figure_row(
            f"daemon RSS growth over {seconds:.0f} s, {label}",
            [b - a for a, b in zip(first, last, strict=True)],
            "MB",
        ),
    ]


def inside(root: Path, fake: str, *, trace: bool, importtime: bool = False) -> tuple[dict[str, Any], str]:
    """One daemon's own view after start (`bench/daemon_inside.py`), and its -X importtime log."""
    node = DaemonNode(root, fake, 1.0)
    out = root / "inside.json"
    argv = [sys.executable, *(["-X", "importtime"] if importtime else [])]
    argv += [str(REPO / "bench" / "daemon_inside.py"), "--after", str(SETTLE_S), "--out", str(out)]
    done = subprocess.run(
        [*argv, *(["--trace"] if trace else [])], env=node.env, capture_output=True, text=True, timeout=120
    )
    if not out.exists():
        raise RuntimeError(f"the daemon wrote no inventory: {done.stderr[-2000:]}")
    return json.loads(out.read_text()), done.stderr


def slowest_imports(log: str, top: int = 12) -> list[tuple[int, str]]:
    """The imports with the largest cumulative time (µs) among those the daemon's own modules
    asked for (`-X importtime`), the biggest first."""
    rows = []
    for line in log.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def composition(root: Path) -> list[dict[str, Any]]:
    """Modules, threads and traced allocations of a daemon on 8 fake GPUs (three daemons), and
    where its import time goes (printed)."""
    looks = [inside(root / f"in{rep}", "h100x8", trace=True)[0] for rep in range(REPEATS)]
    untraced, log = inside(root / "times", "h100x8", trace=False, importtime=True)
    print(f"daemon: {untraced['modules']} modules, threads {untraced['threads']}", file=sys.stderr)
    print(
        "  modules by package: " + ", ".join(f"{k} {v}" for k, v in list(untraced["packages"].items())[:15]),
        file=sys.stderr,
    )
    print("  slowest imports (cumulative µs):", file=sys.stderr)
    for micros, name in slowest_imports(log):
        print(f"    {micros:>9} {name.strip()}", file=sys.stderr)
    print("  largest allocations still held (tracemalloc):", file=sys.stderr)
    for row in looks[0]["top"][:10]:
        print(f"    {row['bytes'] / 1e3:>9.0f} kB  {row['count']:>6}  {row['where']}", file=sys.stderr)
    return [
        figure_row("daemon: modules imported, 8 fake GPUs", [x["modules"] for x in looks], "modules"),
        figure_row("daemon: threads", [len(x["threads"]) - 1 for x in looks], "threads"),  # less the look's
        figure_row("daemon: Python allocations held (tracemalloc)", [x["traced"] / 1e6 for x in looks], "MB"),
    ]


def run() -> list[dict[str, Any]]:
    """RSS over a minute for 1 and 8 fake GPUs, then the inventory (about 2.5 minutes)."""
    root = Path(tempfile.mkdtemp(prefix="gwm", dir="/tmp"))
    seconds = _minute()
    try:
        return [
            *resident(root, "h100", "1 fake GPU", seconds),
            *resident(root, "h100x8", "8 fake GPUs", seconds),
            *composition(root),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main_for(run))
