"""Terminating a stray GPU process (the first fix for "out of memory" on a shared card: clear GPU
memory): one of the user's own that holds GPU memory and is not part of any run. Runs are stopped
through their own API instead, so their checkpoints are written; other users' processes are never
touched."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence

import psutil

from gpuwarden.core.api import TerminateResult
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GpuProcess
from gpuwarden.daemon.supervise import Conflict, owner_of


def terminate_gpu_process(
    pid: int,
    processes: Sequence[GpuProcess],
    run_groups: Mapping[int, str],
    grace: float,
    clock: Callable[[], float],
) -> TerminateResult:
    """SIGTERM `pid` now and SIGKILL it after `grace` seconds if it is still there."""
    listed = [p for p in processes if p.pid == pid]
    if not listed:
        raise UserError(f"process {pid} holds no GPU memory (as of the last process scan)", code="not_found")
    run_id = owner_of(pid, run_groups)
    if run_id is not None:
        raise Conflict(f"process {pid} is part of run {run_id}: stop the run instead (it checkpoints first)")
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
        create_time = proc.create_time()
    except psutil.NoSuchProcess:
        raise UserError(f"process {pid} has already exited", code="not_found") from None
    except psutil.AccessDenied:
        raise UserError(f"process {pid} is not yours: only your own processes can be terminated") from None
    if uid != os.getuid():
        raise UserError(f"process {pid} is not yours: only your own processes can be terminated")
    os.kill(pid, signal.SIGTERM)

    def finish() -> None:
        # Same pid *and* create time: never SIGKILL a new process that reused the pid.
        try:
            again = psutil.Process(pid)
            if again.create_time() == create_time and again.is_running():
                again.send_signal(signal.SIGKILL)
        except psutil.Error:
            return

    timer = threading.Timer(grace, finish)
    timer.name = f"terminate-{pid}"
    timer.daemon = True
    timer.start()
    return TerminateResult(pid=pid, signal="SIGTERM", sigkill_after_s=grace, name=listed[0].name, at=clock())
