"""A process run to its end with its memory peaks read from outside: for programs that report
nothing themselves.

Three high-water marks: the peak resident set (from `wait4`, exact), the peak address space
(`VmPeak` in /proc, read while the process runs; what an address-space limit counts) and, where
a reader is given, the GPU memory its process group holds as the driver reports it. The last two
are sampled, so a spike in the final fraction of a second before exit can be missed: they are
lower bounds, which is why a program's own progress events are preferred where there are any.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# process group id → bytes of GPU memory the group holds now (None when unknown)
GpuUsed = Callable[[int], int | None]


@dataclass(frozen=True)
class Watched:
    """How a watched process ended and the most memory it was seen to hold."""

    exit_code: int | None  # None: killed at the time limit
    signal: int | None
    wall_s: float
    rss_peak: int | None
    vm_peak: int | None
    gpu_peak: int | None


def vm_peak_of(pid: int) -> int | None:
    """VmPeak of a live process (Linux), in bytes; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _highest(current: int | None, new: int | None) -> int | None:
    if new is None:
        return current
    return new if current is None else max(current, new)


def run_watched(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout: Path,
    stderr: Path,
    timeout_s: float,
    gpu_used: GpuUsed | None = None,
    poll_s: float = 0.1,
) -> Watched:
    """Run `argv` in its own session to its end (SIGKILL to the group at `timeout_s`)."""
    start = time.monotonic()
    deadline = start + timeout_s
    vm: int | None = None
    gpu: int | None = None
    timed_out = False
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        vm = _highest(vm, vm_peak_of(proc.pid))
        if gpu_used is not None:
            gpu = _highest(gpu, gpu_used(proc.pid))
        if time.monotonic() > deadline:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(poll_s)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    code = proc.returncode
    return Watched(
        exit_code=None if timed_out else code,
        signal=-code if code < 0 else None,
        wall_s=time.monotonic() - start,
        rss_peak=int(usage.ru_maxrss) * 1024 or None,
        vm_peak=vm,
        gpu_peak=gpu,
    )


__all__ = ["GpuUsed", "Watched", "run_watched", "vm_peak_of"]
