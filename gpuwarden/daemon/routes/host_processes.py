"""The host's heaviest processes now, each with the run it belongs to."""

from __future__ import annotations

import time
from typing import Annotated

import psutil
from fastapi import APIRouter, Query

from gpuwarden.core.api import HostProcesses, RankedProcess
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import errors
from gpuwarden.daemon.supervise import owner_of

TOP_DEFAULT, TOP_MAX = 20, 100

router = APIRouter()


@router.get(
    "/v1/host/processes",
    response_model=HostProcesses,
    responses=errors(422),
    summary="the host's `top` busiest processes by CPU and `top` largest by resident memory (one "
    "list, busiest first), each with its run; read at most every 2 s, whoever asks",
)
def host_processes(
    daemon: DaemonDep,
    top: Annotated[int, Query(ge=1, le=TOP_MAX, description="processes per ranking")] = TOP_DEFAULT,
) -> HostProcesses:
    heaviest = daemon.top.heaviest(top)
    groups = daemon.supervisor.pid_owners()
    return HostProcesses(
        processes=[RankedProcess.of(p, owner_of(p.pid, groups) if groups else None) for p in heaviest],
        cpu_count=psutil.cpu_count(),
        ts=time.time(),
    )
