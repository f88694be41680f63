"""The host's heaviest processes: ranking, CPU measured between scans, processes that end or
deny their details mid-read."""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Any

import psutil

from gpuwarden.core.telemetry.top import STALE_AFTER_S, TopReader

Memory = namedtuple("Memory", "rss")
Uids = namedtuple("Uids", "real effective saved")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeProcess:
    """A process as psutil reads it: `cpu` and `rss` as set, or the error a read would raise."""

    def __init__(self, pid: int, cpu: float, rss: int, *, fails: Exception | None = None) -> None:
        self.pid, self.cpu, self.rss, self.fails = pid, cpu, rss, fails
        self.denied: set[str] = set()

    def as_dict(self, attrs: list[str], ad_value: Any = None) -> dict[str, Any]:
        if self.fails is not None:
            raise self.fails
        values = {"name": f"p{self.pid}", "cpu_percent": self.cpu, "memory_info": Memory(self.rss)}
        values["uids"] = Uids(os.getuid(), os.getuid(), os.getuid())
        return {a: ad_value if a in self.denied else values[a] for a in attrs}

    def cmdline(self) -> list[str]:
        if "cmdline" in self.denied:
            raise psutil.AccessDenied(self.pid)
        return ["python", f"job{self.pid}.py"]


class Host:
    def __init__(self, *procs: FakeProcess) -> None:
        self.procs = {p.pid: p for p in procs}

    def pids(self) -> list[int]:
        return list(self.procs)

    def open(self, pid: int) -> FakeProcess:
        if pid not in self.procs:
            raise psutil.NoSuchProcess(pid)
        return self.procs[pid]


def reader(host: Host, clock: Clock) -> TopReader:
    return TopReader(pids=host.pids, open_process=host.open, clock=clock, every_s=2.0)


def test_first_scan_has_no_cpu_share_the_next_one_measures_and_ranks() -> None:
    host = Host(FakeProcess(1, 5.0, 900), FakeProcess(2, 80.0, 10), FakeProcess(3, 40.0, 20))
    clock = Clock()
    top = reader(host, clock)
    first = top.heaviest(1)
    assert [p.pid for p in first] == [1]  # by memory: no CPU share is known yet
    assert first[0].cpu_percent is None and first[0].cmdline == "python job1.py"
    clock.now += 2.0
    rows = top.heaviest(1)
    assert [(p.pid, p.cpu_percent) for p in rows] == [(2, 80.0), (1, 5.0)]  # busiest, then largest
    assert rows[0].user and rows[0].rss == 10


def test_a_read_serves_for_a_while_and_a_long_pause_measures_nothing() -> None:
    proc = FakeProcess(1, 50.0, 100)
    clock = Clock()
    top = reader(Host(proc), clock)
    top.heaviest(5)
    clock.now += 2.0
    assert top.heaviest(5)[0].cpu_percent == 50.0
    proc.cpu = 10.0
    clock.now += 1.0
    assert top.heaviest(5)[0].cpu_percent == 50.0  # the same scan, not a new one
    clock.now += STALE_AFTER_S + 1
    assert top.heaviest(5)[0].cpu_percent is None  # an average over the pause would mislead


def test_processes_that_end_or_deny_are_skipped_or_shown_with_what_is_readable() -> None:
    ended = FakeProcess(2, 90.0, 500, fails=psutil.NoSuchProcess(2))
    foreign = FakeProcess(3, 30.0, 300)
    foreign.denied = {"uids", "cmdline"}
    host = Host(FakeProcess(1, 10.0, 100), ended, foreign)
    host.procs[4] = FakeProcess(4, 1.0, 1)
    clock = Clock()
    top = reader(host, clock)
    del host.procs[4]  # listed, then gone before its read
    top.heaviest(5)
    clock.now += 2.0
    rows = {p.pid: p for p in top.heaviest(5)}
    assert set(rows) == {1, 3}
    assert rows[3].user is None and rows[3].cmdline is None
    assert rows[3].cpu_percent == 30.0 and rows[3].rss == 300 and rows[3].name == "p3"


def test_this_process_is_read_through_psutil() -> None:
    clock = Clock()
    top = TopReader(clock=clock)
    top.heaviest(500)
    clock.now += 2.0
    me = [p for p in top.heaviest(100_000) if p.pid == os.getpid()]
    assert me and me[0].rss and me[0].cpu_percent is not None and me[0].cmdline
