"""The daemon itself: its health and its shutdown."""

from __future__ import annotations

import os

from fastapi import APIRouter

from gpuwarden import __version__
from gpuwarden.core.api import Health, ShutdownResult
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import errors

API_VERSION = "1.0"

router = APIRouter()


@router.get(
    "/v1/health",
    response_model=Health,
    responses=errors(),
    summary="daemon version, API version, pid, uptime, GPU status, and a fault that degrades it",
)
def health(daemon: DaemonDep) -> Health:
    fault = daemon.storage.fault
    return Health(
        name="gpuwarden",
        version=__version__,
        api_version=API_VERSION,
        pid=os.getpid(),
        uptime_s=round(daemon.uptime, 3),
        gpu_status=daemon.gpu_status,
        db=str(daemon.paths.db),
        socket=str(daemon.paths.socket),
        active_runs=len(daemon.supervisor.active),
        stream_clients=daemon.broadcaster.client_count,
        status="ok" if fault is None else "degraded",
        fault=fault,
        samples_dropped=daemon.storage.samples_dropped,
    )


@router.post(
    "/v1/shutdown",
    response_model=ShutdownResult,
    responses=errors(),
    summary="stop the daemon (runs keep running and are re-adopted later)",
)
def shutdown(daemon: DaemonDep) -> ShutdownResult:
    daemon.request_shutdown()
    return ShutdownResult(stopping=True, pid=os.getpid())
