"""Processes on the GPUs: the latest scan with each one's run, stored reads, and terminating a
stray process of the user's own."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpuwarden.core.api import LiveProcess, LiveProcesses, ProcessReads, StopRequest, TerminateResult
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import WITH_A_BODY, errors
from gpuwarden.daemon.strays import terminate_gpu_process
from gpuwarden.daemon.supervise import owner_of

# Stored process reads one request may return (a day of 5-second scans of ~5 processes).
PROCESS_ROWS_MAX = 100_000
DEFAULT_GRACE_S = 5.0

router = APIRouter()


@router.get(
    "/v1/processes",
    response_model=LiveProcesses | ProcessReads,
    responses=errors(404, 422),
    summary="processes on the GPUs now (`gpu`: on that one), with the run each belongs to; with "
    "`since` or `until`, every stored process read in [since, until) instead (oldest first, raw "
    "retention; an empty window holds none)",
)
def processes(
    daemon: DaemonDep,
    since: Annotated[float | None, Query(ge=0, le=1e11, description="unix seconds")] = None,
    until: Annotated[float | None, Query(ge=0, le=1e11, description="unix seconds")] = None,
    gpu: Annotated[str | None, Query(max_length=128, description="one GPU UUID (default: all)")] = None,
    limit: Annotated[int, Query(ge=1, le=PROCESS_ROWS_MAX)] = PROCESS_ROWS_MAX,
) -> LiveProcesses | ProcessReads:
    if since is None and until is None:
        if gpu is not None:
            daemon.telemetry_reader().processes(uuid=gpu)  # a GPU it does not know: 404, as below
        groups = daemon.supervisor.pid_owners()
        scan = [p for p in daemon.latest_processes if gpu is None or p.uuid == gpu]
        return LiveProcesses(processes=[LiveProcess.of(p, owner_of(p.pid, groups)) for p in scan])
    store = daemon.telemetry_reader()
    kept_since = store.oldest_process_read()
    if until is not None and until <= (since or 0):
        return ProcessReads(processes=[], truncated=False, kept_since=kept_since)
    # One row more than asked tells whether the answer was cut.
    stored = store.processes(latest_only=False, uuid=gpu, since=since or 0, until=until, limit=limit + 1)
    return ProcessReads(processes=stored[:limit], truncated=len(stored) > limit, kept_since=kept_since)


@router.post(
    "/v1/processes/{pid}/terminate",
    response_model=TerminateResult,
    responses=errors(WITH_A_BODY, 400, 404, 409, 422),
    summary="SIGTERM a stray GPU process of yours (not part of a run), SIGKILL after the grace period",
)
def terminate_process(daemon: DaemonDep, pid: int, body: StopRequest | None = None) -> TerminateResult:
    grace = body.grace_seconds if body is not None and body.grace_seconds is not None else DEFAULT_GRACE_S
    return terminate_gpu_process(
        pid, daemon.latest_processes, daemon.supervisor.pid_owners(), grace, daemon.supervisor.clock
    )
