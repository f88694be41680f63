"""Every GPU of several hosts as one list: the host, the card, its memory free, utilisation,
power and the runs on it, from each host's daemon (its latest tick and process scan)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gpuwarden.client.api import ApiClient
from gpuwarden.core.api import GpuInfo, LiveProcess
from gpuwarden.core.telemetry.types import GpuSample


class FleetGpu(BaseModel):
    """One GPU of one host as the fleet overview shows it."""

    model_config = ConfigDict(frozen=True)

    host: str
    index: int
    name: str
    uuid: str
    mem_total: int | None = None
    mem_free: int | None = None
    util: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    lost: bool = False
    runs: tuple[str, ...] = ()  # ids of the runs whose processes hold memory on it


def gpu_rows(host: str, gpus: list[GpuInfo], processes: list[LiveProcess]) -> list[FleetGpu]:
    """The rows of one host's GPUs, in its index order."""
    rows = []
    for gpu in gpus:
        sample = gpu.sample
        total = sample.mem_total if sample and sample.mem_total is not None else gpu.memory_total
        used = sample.mem_used if sample else None
        runs = sorted({p.run_id for p in processes if p.uuid == gpu.uuid and p.run_id})
        util = None if sample is None else _util(sample)
        rows.append(
            FleetGpu(
                host=host,
                index=gpu.index,
                name=gpu.name,
                uuid=gpu.uuid,
                mem_total=total,
                mem_free=None if total is None or used is None else max(0, total - used),
                util=util,
                power_w=sample.power_w if sample else None,
                power_limit_w=sample.power_limit_w if sample else None,
                lost=bool(sample and sample.lost),
                runs=tuple(runs),
            )
        )
    return rows


def read_gpus(host: str, client: ApiClient) -> list[FleetGpu]:
    """One host's GPU rows, read from its daemon."""
    return gpu_rows(host, client.gpus().gpus, client.processes())


def by_free_memory(rows: list[FleetGpu]) -> list[FleetGpu]:
    """The GPUs with the most memory free first (unknown last), then by host and index."""
    return sorted(rows, key=lambda r: (r.mem_free is None or r.lost, -(r.mem_free or 0), r.host, r.index))


def _util(sample: GpuSample) -> float | None:
    # the fine-grained reading where the daemon has one, as `gpuwarden monitor` shows it
    return sample.util_gpu_fine if sample.util_gpu_fine is not None else sample.util_gpu
