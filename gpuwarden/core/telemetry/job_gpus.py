"""The GPUs a job was given, out of every GPU NVML sees on its node.

A scheduler hands a job some of a node's GPUs and says which in `CUDA_VISIBLE_DEVICES` (indices
or UUIDs); Slurm also in `SLURM_JOB_GPUS`. Where the node does not hide the others (no device
cgroup), NVML still lists them all: a job's supervisor must sample, place on and report only its
own. `JobGpus` is a `GpuReader` that shows the wrapped one's GPUs the job was given, no other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwarden.core.telemetry.topology import GpuTopology
from gpuwarden.core.telemetry.types import GpuProcess, GpuReader, GpuSample, GpuStatic


def job_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The GPUs the environment says the job was given (indices or UUIDs, as written), or None
    when nothing restricts it. An empty `CUDA_VISIBLE_DEVICES` gives none."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = environ.get(name)
        if value is not None:
            return [part.strip() for part in value.split(",") if part.strip()]
    return None


def _named(gpu: GpuStatic, names: Sequence[str]) -> bool:
    # CUDA takes a unique UUID prefix as well as the whole UUID.
    return any(
        n == str(gpu.index) or (n.startswith(("GPU-", "MIG-")) and gpu.uuid.startswith(n)) for n in names
    )


class JobGpus:
    """`reader` restricted to the GPUs `names` (indices or UUIDs) selects."""

    def __init__(self, reader: GpuReader, names: Sequence[str]) -> None:
        self._reader = reader
        self._names = list(names)

    def _uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self._reader.gpus() if _named(g, self._names))

    @property
    def status(self) -> str | None:
        status = self._reader.status
        if status is None and not self.gpus():
            return f"none of the GPUs here is one the job was given ({', '.join(self._names) or 'none'})"
        return status

    def gpus(self) -> list[GpuStatic]:
        return [g for g in self._reader.gpus() if _named(g, self._names)]

    def sample(self, ts: float) -> list[GpuSample]:
        mine = self._uuids()
        return [s for s in self._reader.sample(ts) if s.uuid in mine]

    def processes(self, ts: float) -> list[GpuProcess]:
        mine = self._uuids()
        return [p for p in self._reader.processes(ts) if p.uuid in mine]

    def read_pcie(self, samples: list[GpuSample]) -> None:
        self._reader.read_pcie(samples)

    def topology(self) -> GpuTopology:
        mine = self._uuids()
        links = {pair: link for pair, link in self._reader.topology().links.items() if pair <= mine}
        return GpuTopology(links=links)

    def energy_mj(self, uuid: str) -> int | None:
        return self._reader.energy_mj(uuid) if uuid in self._uuids() else None

    def close(self) -> None:
        self._reader.close()
