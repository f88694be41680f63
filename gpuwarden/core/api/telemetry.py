"""Answers about the daemon, the GPUs, the host and their processes and history.

The telemetry records (`GpuStatic`, `GpuSample`, `GpuProcess`, `HostSample`) are the core's own
dataclasses; pydantic validates and documents them as they are, so the API carries exactly what
the sampler read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gpuwarden.core.api.base import ApiModel
from gpuwarden.core.telemetry.types import GpuProcess, GpuSample, GpuStatic, HostProcess, HostSample

# [bucket start s, avg, min, max]; for energy_j the joules used in the bucket in all three slots.
# (A list of four rather than a tuple: tuple schemas, `prefixItems`, trip up OpenAPI tooling.)
Bucket = Annotated[list[float], Field(min_length=4, max_length=4)]


class Health(ApiModel):
    name: str
    version: str
    api_version: str = Field(description="a client refuses a daemon whose major version differs")
    pid: int
    uptime_s: float
    gpu_status: str = Field(description="one line: the GPUs sampled, or why none are")
    db: str
    socket: str
    active_runs: int
    stream_clients: int
    status: Literal["ok", "degraded"] = Field(
        "ok", description="degraded while the daemon cannot write its database or state folder"
    )
    fault: str | None = Field(
        None, description="one line: what the daemon cannot write, why, and the fix (None when ok)"
    )
    samples_dropped: int = Field(0, description="samples the store refused since the daemon started")


@dataclass(frozen=True)
class GpuInfo(GpuStatic):
    """A GPU's static facts with its latest sample (None before the first tick)."""

    sample: GpuSample | None = None

    @classmethod
    def of(cls, static: GpuStatic, sample: GpuSample | None) -> GpuInfo:
        return cls(**_fields_of(static, GpuStatic), sample=sample)


class GpuList(ApiModel):
    status: str = Field(description="one line: the GPUs sampled, or why none are")
    ts: float | None = Field(description="when the latest tick was read (None before the first)")
    gpus: list[GpuInfo]


class HostReading(ApiModel):
    host: HostSample | None


@dataclass
class LiveProcess(GpuProcess):
    """A process on a GPU now, with the run it belongs to (None: not started by gpuwarden)."""

    run_id: str | None = None

    @classmethod
    def of(cls, process: GpuProcess, run_id: str | None) -> LiveProcess:
        return cls(**_fields_of(process, GpuProcess), run_id=run_id)


class LiveProcesses(ApiModel):
    """The latest process scan (`GET /v1/processes` without `since`)."""

    model_config = ConfigDict(extra="forbid")  # tells it apart from ProcessReads in the response union

    processes: list[LiveProcess]


class ProcessReads(ApiModel):
    """Stored process reads in a window, oldest first (`GET /v1/processes?since=…`)."""

    processes: list[GpuProcess]
    truncated: bool = Field(description="more reads matched than `limit`: ask again from the last ts")
    kept_since: float | None = Field(
        description="reads before this were dropped by retention (None: no read stored yet)"
    )


@dataclass
class RankedProcess(HostProcess):
    """A process on the host with the run it belongs to (None: not started by gpuwarden)."""

    run_id: str | None = None

    @classmethod
    def of(cls, process: HostProcess, run_id: str | None) -> RankedProcess:
        return cls(**_fields_of(process, HostProcess), run_id=run_id)


class HostProcesses(ApiModel):
    """The host's heaviest processes now (`GET /v1/host/processes`)."""

    processes: list[RankedProcess] = Field(
        description="the busiest by CPU and the largest by resident memory, busiest first"
    )
    cpu_count: int | None = Field(description="logical CPUs: a process's CPU % goes up to 100 × this")
    ts: float = Field(description="when answered (the read behind it is at most 2 s older)")


class TerminateResult(ApiModel):
    pid: int
    signal: Literal["SIGTERM"]
    sigkill_after_s: float
    name: str | None
    at: float


class HistoryAnswer(ApiModel):
    """Downsampled series: `series[key][metric]` is a list of buckets, key a GPU UUID or "host".
    Buckets without a value for a metric are left out."""

    tier: Literal["raw", "1m", "1h"] = Field(description="the store tier the buckets come from")
    step: float = Field(description="seconds per bucket")
    start: float
    end: float
    series: dict[str, dict[str, list[Bucket]]] = Field(
        description="[bucket start s, avg, min, max] per bucket; energy_j: joules in every value slot"
    )


class MetricNames(ApiModel):
    gpu: list[str]
    host: list[str]


class SampleBody(ApiModel):
    """The body of a `sample` frame on the live stream: one tick."""

    ts: float
    gpus: list[GpuSample]
    host: HostSample | None


class ShutdownResult(ApiModel):
    stopping: bool
    pid: int


def _fields_of(record: object, cls: type[object]) -> dict[str, Any]:
    """The fields `cls` (a dataclass) declares, read from `record` (an instance of it)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
