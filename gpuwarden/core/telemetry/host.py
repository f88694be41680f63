"""Host telemetry through psutil: CPU, memory, load and swap, and host facts for GPU processes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from gpuwarden.core.telemetry.types import GpuProcess, HostSample
from gpuwarden.core.telemetry.user_names import UserNames

_MEMINFO = "/proc/meminfo"
_MEMINFO_KEYS = (b"MemTotal:", b"MemAvailable:", b"SwapTotal:", b"SwapFree:")


def _read_meminfo() -> tuple[int, int, int, int] | None:
    """MemTotal, MemAvailable, SwapTotal, SwapFree in bytes, or None where /proc is unusable.

    One read of /proc/meminfo costs ~25 µs; psutil's virtual_memory() plus swap_memory() cost
    ~150 µs (swap_memory also parses /proc/vmstat), which is most of a tick's budget.
    """
    try:
        with open(_MEMINFO, "rb") as f:
            data = f.read()
        values = []
        for key in _MEMINFO_KEYS:
            start = data.index(key) + len(key)
            values.append(int(data[start : data.index(b"\n", start)].split()[0]) * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return values[0], values[1], values[2], values[3]


# psutil's CPU share over a shorter span than this is mostly rounding: a sample taken right after
# the baseline (a daemon's first tick) read 0 % on a loaded machine.
MIN_CPU_SPAN_S = 0.25


class HostReader:
    """Reads host-wide CPU, memory, load and swap; cheap enough to call every tick."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # cpu_percent(None) measures since the previous call; the first call only sets the baseline.
        psutil.cpu_percent(interval=None, percpu=True)
        self._cpu_since = clock()
        self._proc_meminfo = _read_meminfo() is not None

    def _cpu_percent(self) -> tuple[float | None, list[float] | None]:
        """The CPU share since the last reading, all cores and each; None (unknown, never a
        made-up 0 %) until enough time has passed since the baseline to measure one.

        One per-core call serves both: every core spans the same wall time, so their mean is the
        host's share, and a second (global) call would cost a second parse of /proc/stat.
        """
        now = self._clock()
        if now - self._cpu_since < MIN_CPU_SPAN_S:
            return None, None
        self._cpu_since = now
        cores = [float(c) for c in psutil.cpu_percent(interval=None, percpu=True)]
        return (round(sum(cores) / len(cores), 1) if cores else None), cores

    def sample(self, ts: float) -> HostSample:
        """One HostSample. Memory used is total - available, the figure that predicts pressure."""
        meminfo = _read_meminfo() if self._proc_meminfo else None
        if meminfo is not None:
            mem_total, mem_available, swap_total, swap_free = meminfo
            swap_used = swap_total - swap_free
        else:
            vm = psutil.virtual_memory()
            mem_total, mem_available = vm.total, vm.available
            swap = psutil.swap_memory()
            swap_used, swap_total = swap.used, swap.total
        load1: float | None
        load5: float | None
        load15: float | None
        try:
            load1, load5, load15 = os.getloadavg()
        except OSError:
            load1 = load5 = load15 = None
        cpu, cores = self._cpu_percent()
        return HostSample(
            ts=ts,
            cpu_percent=cpu,
            mem_used=mem_total - mem_available,
            mem_total=mem_total,
            load1=load1,
            load5=load5,
            load15=load15,
            swap_used=swap_used,
            swap_total=swap_total,
            cpu_cores=cores,
        )


@dataclass(frozen=True)
class _ProcInfo:
    name: str | None = None
    cmdline: str | None = None
    user: str | None = None
    cpu_percent: float | None = None
    rss: int | None = None


_GONE = _ProcInfo()


class ProcessEnricher:
    """Fills name, cmdline, user, CPU % and RSS on GpuProcess rows from psutil.

    Keeps each psutil.Process between calls so cpu_percent measures the interval since the last
    call; on a process's first appearance CPU % is None rather than psutil's meaningless 0.0.
    A PID that vanished (or that we may not inspect) keeps its row with None host fields. A PID
    on several GPUs is looked up once.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._user = UserNames()

    def __call__(self, rows: list[GpuProcess]) -> None:
        """Enrich `rows` in place."""
        infos: dict[int, _ProcInfo] = {}
        alive: dict[int, psutil.Process] = {}
        for row in rows:
            info = infos.get(row.pid)
            if info is None:
                info = infos[row.pid] = self._info(row.pid, alive)
            row.name = info.name
            row.cmdline = info.cmdline
            row.user = info.user
            row.cpu_percent = info.cpu_percent
            row.rss = info.rss
        self._procs = alive

    def _info(self, pid: int, alive: dict[int, psutil.Process]) -> _ProcInfo:
        proc = self._procs.get(pid)
        first = False
        # is_running() also compares the create time, so a reused PID counts as a new process.
        if proc is None or not proc.is_running():
            first = True
            try:
                proc = psutil.Process(pid)
            except psutil.Error:
                return _GONE
        with proc.oneshot():
            try:
                name = proc.name()
            except psutil.Error:
                return _GONE
            alive[pid] = proc
            try:
                cmdline = " ".join(proc.cmdline()) or None
            except psutil.Error:
                cmdline = None
            try:
                cpu = proc.cpu_percent(interval=None)
            except psutil.Error:
                cpu = None
            try:
                rss: int | None = proc.memory_info().rss
            except psutil.Error:
                rss = None
            try:
                user = self._user(proc.uids().real)
            except psutil.Error:
                user = None
        return _ProcInfo(name, cmdline, user, None if first else cpu, rss)
