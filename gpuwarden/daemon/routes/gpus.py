"""The GPUs and the host: static facts and the latest sample."""

from __future__ import annotations

from fastapi import APIRouter

from gpuwarden.core.api import GpuInfo, GpuList, HostReading
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import errors

router = APIRouter()


@router.get(
    "/v1/gpus", response_model=GpuList, responses=errors(), summary="GPUs: static facts and the latest sample"
)
def gpus(daemon: DaemonDep) -> GpuList:
    tick = daemon.latest_tick
    return GpuList(
        status=daemon.gpu_status,
        ts=tick.ts if tick else None,
        gpus=[GpuInfo.of(static, sample) for static, sample in daemon.gpu_snapshot()],
    )


@router.get("/v1/host", response_model=HostReading, responses=errors(), summary="the latest host sample")
def host(daemon: DaemonDep) -> HostReading:
    tick = daemon.latest_tick
    return HostReading(host=tick.host if tick else None)
