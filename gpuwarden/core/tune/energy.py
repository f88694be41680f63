"""Joules over a probe's measured steps, from the GPU's cumulative energy counter.

The probe process runs the real runner; this process reads the counter of the probe's GPU on a
thread while it runs (NVML's counter is cheap to read), with the time of each reading. The
runner's progress events say when the measured steps began and ended (same wall clock), and the
counter interpolated at those two moments gives the energy of exactly the steps the throughput
figure counts — model loading and warm-up left out.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol


class EnergyCounter(Protocol):
    """A GPU's cumulative energy counter."""

    def read_mj(self) -> int | None:
        """Millijoules since the driver loaded; None when it cannot be read now."""
        ...


class _EnergyReader(Protocol):
    def energy_mj(self, uuid: str) -> int | None: ...


@dataclass
class GpuEnergyCounter:
    """The counter of one GPU, read through a telemetry reader (`NvmlReader.energy_mj`)."""

    reader: _EnergyReader
    uuid: str

    def read_mj(self) -> int | None:
        return self.reader.energy_mj(self.uuid)


class EnergyTrace:
    """Reads a counter every `interval` seconds on a thread while the `with` block runs."""

    def __init__(
        self, counter: EnergyCounter, *, interval: float = 0.05, clock: Callable[[], float] = time.time
    ) -> None:
        self._counter = counter
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.times: list[float] = []
        self.values: list[float] = []

    def _read(self) -> None:
        # A reading takes time (milliseconds on a real driver): it is timed at its middle.
        before = self._clock()
        value = self._counter.read_mj()
        after = self._clock()
        if value is None:
            return
        if self.values and value < self.values[-1]:
            # The driver reloaded (the counter restarts): what came before cannot be joined.
            self.times.clear()
            self.values.clear()
        self.times.append((before + after) / 2)
        self.values.append(float(value))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._read()

    def __enter__(self) -> EnergyTrace:
        self._read()
        self._thread = threading.Thread(target=self._loop, name="energy-trace", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._read()

    def at(self, ts: float) -> float | None:
        """The counter (mJ) at `ts`, interpolated between the readings around it; None outside."""
        times = self.times
        if not times or ts < times[0] or ts > times[-1]:
            return None
        i = bisect.bisect_left(times, ts)
        if times[i] == ts or i == 0:
            return self.values[i]
        t0, t1 = times[i - 1], times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (ts - t0) / (t1 - t0)

    def joules(self, start: float, end: float) -> float | None:
        """Energy between two moments inside the trace, in joules."""
        a, b = self.at(start), self.at(end)
        if a is None or b is None or end <= start:
            return None
        return (b - a) / 1000.0
