"""One sampling step: GPUs and host every tick, processes and PCIe every `process_interval`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from gpuwarden.core.telemetry.topology import GpuTopology
from gpuwarden.core.telemetry.types import GpuReader, GpuStatic, HostSample, Tick

# A tick that arrives this much early still counts as due (loop timers jitter by milliseconds).
_CADENCE_SLACK = 0.05


class HostSource(Protocol):
    """What the sampler needs from a host reader."""

    def sample(self, ts: float) -> HostSample: ...


class Sampler:
    """Builds Ticks from a GPU reader and a host reader; the daemon's loop calls `tick()` at 1 Hz.

    Process lists and PCIe throughput are slow on hardware (milliseconds per GPU), so they are read
    on the first tick and then whenever `process_interval` has passed; `Tick.processes` is None on
    the other ticks. `gpus_version` goes up whenever the GPU set or what they support changes, so
    the caller knows to store `gpus()` again.
    """

    def __init__(
        self,
        gpu_reader: GpuReader,
        host_reader: HostSource | None,
        *,
        process_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._gpu = gpu_reader
        self._host = host_reader
        self._interval = process_interval
        self._clock = clock
        self._next_processes: float | None = None
        self._static = gpu_reader.gpus()
        self._uuids = frozenset(g.uuid for g in self._static)
        self.gpus_version = 0

    @property
    def status(self) -> str | None:
        """The GPU reader's status line (None while GPUs are read)."""
        return self._gpu.status

    def gpus(self) -> list[GpuStatic]:
        """Static facts of the GPUs, as of the last tick."""
        return list(self._static)

    def topology(self) -> GpuTopology:
        """How the GPUs are linked (NVLink, PCIe), for placing multi-GPU runs."""
        return self._gpu.topology()

    def tick(self) -> Tick:
        """Read everything due now."""
        ts = self._clock()
        samples = self._gpu.sample(ts)
        host = self._host.sample(ts) if self._host is not None else None
        processes = None
        due = self._next_processes
        # A clock stepped back by more than an interval would otherwise stall process reads.
        if due is None or ts + _CADENCE_SLACK >= due or due - ts > self._interval + _CADENCE_SLACK:
            self._next_processes = ts + self._interval
            processes = self._gpu.processes(ts)
            self._gpu.read_pcie(samples)
            self._refresh_static()
        elif len(samples) != len(self._uuids) or any(s.uuid not in self._uuids for s in samples):
            self._refresh_static()
        return Tick(ts=ts, gpus=samples, host=host, processes=processes)

    def energy_mj(self, uuids: list[str]) -> dict[str, int]:
        """The energy counters (mJ) of these GPUs read now; those without one are left out."""
        read = {uuid: self._gpu.energy_mj(uuid) for uuid in uuids}
        return {uuid: mj for uuid, mj in read.items() if mj is not None}

    def _refresh_static(self) -> None:
        static = self._gpu.gpus()
        if static != self._static:
            self._static = static
            self._uuids = frozenset(g.uuid for g in static)
            self.gpus_version += 1

    def close(self) -> None:
        """Release the GPU reader."""
        self._gpu.close()
