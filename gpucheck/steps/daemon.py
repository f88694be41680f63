"""The daemon and the dashboard on the real driver: the daemon's CPU and RSS at 1 Hz, and the
dashboard's first paint over the daemon's API with the real GPUs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpucheck.result import StepResult


def _daemon_cost(root: Path) -> list[dict[str, Any]]:
    from bench.bench_daemon import idle_cost

    return idle_cost(root, fake="", label="the real driver")


def _dashboard(root: Path) -> list[dict[str, Any]]:
    from bench.bench_daemon import DaemonNode
    from bench.bench_tui import first_paint

    node = DaemonNode(root / "tui", "", 1.0)
    node.start()
    try:
        return [first_paint("api", env=node.env)]
    finally:
        node.stop()


def run(name: str) -> StepResult:
    # A short path: the daemon's socket lives under it (Unix socket paths are limited to 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="gwc", dir="/tmp"))
    try:
        rows = _daemon_cost(root) if name == "daemon-cost" else _dashboard(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return StepResult.from_rows(
        name, rows, "; ".join(f"{r['benchmark']}: {r['value']:.3g} {r['unit']}" for r in rows)
    )
