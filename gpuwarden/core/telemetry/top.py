"""The host's heaviest processes, by CPU and by resident memory, read through psutil on request.

Reading every process costs a few file reads each (tens of milliseconds on a busy host), so the
daemon does it only when asked and serves one read for `READ_EVERY_S`: a dashboard left open costs
one scan every few seconds, a daemon nobody watches costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import psutil

from gpuwarden.core.telemetry.types import HostProcess
from gpuwarden.core.telemetry.user_names import UserNames

READ_EVERY_S = 2.0  # one scan serves every request this close to it
# A process's CPU share is measured from the previous scan: after a longer pause (nobody watched)
# that would be an average over minutes, so the scan after it measures nothing.
STALE_AFTER_S = 15.0
# The fields a scan reads of every process; the command line only for those shown.
_ATTRS = ["name", "cpu_percent", "memory_info", "uids"]


class ProcessHandle(Protocol):
    """What a scan asks of one process (a `psutil.Process`, or a test's stand-in)."""

    def as_dict(self, attrs: list[str], ad_value: Any = None) -> dict[str, Any]: ...

    def cmdline(self) -> list[str]: ...


@dataclass(frozen=True)
class _Read:
    """One process as the last scan read it."""

    process: HostProcess
    handle: ProcessHandle


class TopReader:
    """The heaviest processes on the host, from a scan at most `every_s` old.

    Keeps each process's handle between scans, so CPU % measures the time since the previous scan;
    a process seen for the first time has no CPU % (None), not psutil's meaningless 0.0. Processes
    that end during a scan are skipped; fields another user's process denies are None.
    """

    def __init__(
        self,
        *,
        pids: Callable[[], Iterable[int]] = psutil.pids,
        open_process: Callable[[int], ProcessHandle] = psutil.Process,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = READ_EVERY_S,
    ) -> None:
        self._pids, self._open, self._clock, self._every = pids, open_process, clock, every_s
        self._lock = threading.Lock()
        self._handles: dict[int, ProcessHandle] = {}
        self._reads: list[_Read] = []
        self._scanned_at: float | None = None
        self._user = UserNames()
        self._commands: dict[int, str | None] = {}

    def heaviest(self, count: int) -> list[HostProcess]:
        """The `count` busiest processes and the `count` largest in memory (one list, busiest
        first, at most 2 × count rows), each with its command line."""
        with self._lock:
            now = self._clock()
            if self._scanned_at is None or now - self._scanned_at >= self._every:
                measured = self._scanned_at is not None and now - self._scanned_at <= STALE_AFTER_S
                self._reads = self._scan(measured)
                self._scanned_at = now
            return [self._with_command(r) for r in ranked(self._reads, count)]

    def _scan(self, measured: bool) -> list[_Read]:
        handles: dict[int, ProcessHandle] = {}
        reads: list[_Read] = []
        for pid in self._pids():
            read = self._read(pid, measured)
            if read is not None:
                handles[pid] = read.handle
                reads.append(read)
        self._commands = {pid: c for pid, c in self._commands.items() if pid in handles}
        self._handles = handles
        return reads

    def _read(self, pid: int, measured: bool) -> _Read | None:
        handle = self._handles.get(pid)
        first = handle is None
        try:
            if handle is None:
                handle = self._open(pid)
            info = handle.as_dict(attrs=_ATTRS, ad_value=None)
        except psutil.Error:
            return None  # ended between the list of pids and its read
        memory = info.get("memory_info")
        uids = info.get("uids")
        cpu = info.get("cpu_percent")
        process = HostProcess(
            pid=pid,
            user=None if uids is None else self._user(uids.real),
            cpu_percent=None if first or not measured or cpu is None else float(cpu),
            rss=None if memory is None else int(memory.rss),
            name=info.get("name"),
        )
        return _Read(process, handle)

    def _with_command(self, read: _Read) -> HostProcess:
        pid = read.process.pid
        if pid not in self._commands:
            try:
                self._commands[pid] = " ".join(read.handle.cmdline()) or None
            except psutil.Error:
                self._commands[pid] = None  # denied, or a kernel thread's empty one
        return replace(read.process, cmdline=self._commands[pid])


def ranked(reads: list[_Read], count: int) -> list[_Read]:
    """The `count` highest by CPU and the `count` highest by RSS, busiest first."""
    by_cpu = sorted(reads, key=_cpu_then_rss, reverse=True)[:count]
    by_rss = sorted(reads, key=lambda r: r.process.rss or 0, reverse=True)[:count]
    chosen = {r.process.pid: r for r in by_cpu + by_rss}
    return sorted(chosen.values(), key=_cpu_then_rss, reverse=True)


def _cpu_then_rss(read: _Read) -> tuple[float, int]:
    p = read.process
    return (p.cpu_percent if p.cpu_percent is not None else -1.0, p.rss or 0)
