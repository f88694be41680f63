"""Dashboard benchmarks, headless, against the FakeBackend (no daemon, no GPU needed).

- first paint: a fresh interpreter imports the dashboard, starts the app and applies the first load
  (GPU cards, runs, processes) and paints it. Target ≤ 1.5 s.
- CPU at 1 Hz × 8 GPUs: process CPU time (UI thread and stream thread together) over ~10 s of live
  sample frames on a 160×48 screen showing all eight cards. Target ≤ 5 % of one core.
- 7-day window: from the key press to the history charts redrawn with the new window. Target
  ≤ 200 ms. The FakeBackend answers in microseconds, so this measures the dashboard's share; the
  store's query time is benchmarked by bench_store.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from typing import Any

from bench.figures import REPEATS, figure_row, main_for

FIRST_PAINT_TARGET_S = 1.5
CPU_TARGET_PCT = 5.0
WINDOW_TARGET_MS = 200.0
CPU_SECONDS = 10.0

# argv[1]: "fake" (the FakeBackend, 2 GPUs) or "api" (the daemon that $XDG_RUNTIME_DIR points at).
_FIRST_PAINT = textwrap.dedent(
    """
    import time
    t0 = time.perf_counter()
    import asyncio, json, sys
    from gpuwarden.tui.app import GpuwardenApp

    def backend():
        if sys.argv[1] == "api":
            from gpuwarden.client import ApiClient
            from gpuwarden.tui.api_backend import ApiBackend
            return ApiBackend(ApiClient())
        from tests.tui.fake_backend import FakeBackend
        return FakeBackend(2)

    async def main():
        app = GpuwardenApp(backend())
        async with app.run_test(size=(80, 24)) as pilot:
            while not app.connected:
                await pilot.pause(0.005)
            await pilot.pause()  # the refresh that paints the loaded state
            names = [g.static.name for g in app.live.gpus.values()]
            print(json.dumps({"s": time.perf_counter() - t0, "gpus": names}))

    asyncio.run(main())
    """
)


def first_paint(backend: str = "fake", env: dict[str, str] | None = None) -> dict[str, Any]:
    """Cold starts, `REPEATS` of them (the first may pay for the OS file cache)."""
    seconds: list[float] = []
    names: list[str] = []
    for _ in range(REPEATS):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_PAINT, backend],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env=env,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        seconds.append(result["s"])
        names = result["gpus"]
    what = "cold interpreter" if backend == "fake" else f"over the daemon's API, {len(names)} GPU(s)"
    if backend == "api" and names:
        what += f": {', '.join(sorted(set(names)))}"
    return figure_row(
        f"tui first paint ({what})",
        seconds,
        "s",
        target=f"≤ {FIRST_PAINT_TARGET_S}",
        check=lambda v: v <= FIRST_PAINT_TARGET_S,
    )


async def _cpu() -> tuple[float, int, int]:
    from gpuwarden.tui.app import GpuwardenApp
    from tests.tui.fake_backend import FakeBackend

    fake = FakeBackend(8, clock=time.time, interval=1.0)
    app = GpuwardenApp(fake, clock=time.time)
    async with app.run_test(size=(160, 48)) as pilot:
        while not app.connected:
            await pilot.pause(0.01)
        await pilot.pause(1.0)  # let the first load's layout settle before measuring
        redraws = app.redraws
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(CPU_SECONDS)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        return 100.0 * cpu / wall, app.redraws - redraws, len(app.live.gpus)


def cpu_at_1hz() -> dict[str, Any]:
    readings = []
    for _ in range(REPEATS):
        pct, redraws, gpus = asyncio.run(_cpu())
        assert gpus == 8 and redraws >= CPU_SECONDS - 2, (gpus, redraws)
        readings.append(pct)
    return figure_row(
        f"tui CPU, 1 Hz updates, {gpus} GPUs, 160x48 (~{redraws} redraws in {CPU_SECONDS:.0f} s)",
        readings,
        "% of a core",
        target=f"≤ {CPU_TARGET_PCT}",
        check=lambda v: v <= CPU_TARGET_PCT,
    )


async def _window() -> list[float]:
    from gpuwarden.tui.app import GpuwardenApp
    from gpuwarden.tui.screens.history import HistoryPane
    from tests.tui.fake_backend import FakeBackend

    app = GpuwardenApp(FakeBackend(8))
    timings: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        while not app.connected:
            await pilot.pause(0.01)
        pane = app.query_one(HistoryPane)
        await pilot.press("3")
        for _ in range(5):
            # Start from 24 h each time, then time 24 h → 7 d.
            while pane.window != "24h":
                await pilot.press("w")
            while pane.loaded != ("24h", pane.metrics, pane.host_metrics):
                await pilot.pause(0.005)
            start = time.perf_counter()
            await pilot.press("w")
            while pane.loaded != ("7d", pane.metrics, pane.host_metrics):
                await asyncio.sleep(0.001)
            await pilot.pause()  # the repaint of the new charts
            timings.append(1000 * (time.perf_counter() - start))
    return timings


def switch_to_7d() -> dict[str, Any]:
    return figure_row(
        "tui switch history to 7 d (8 GPUs)",
        asyncio.run(_window()),
        "ms",
        target=f"≤ {WINDOW_TARGET_MS:.0f}",
        check=lambda v: v <= WINDOW_TARGET_MS,
    )


def run() -> list[dict[str, Any]]:
    return [first_paint(), cpu_at_1hz(), switch_to_7d()]


if __name__ == "__main__":
    raise SystemExit(main_for(run))
