"""Messages that thread workers post to the app. Small, and `bubble=False`: only the app reads them.

`FramesReady` and `RunsLoaded` may replace a pending message of their kind (`can_replace`), so on
a slow link a backlog collapses into one redraw of the newest state instead of queueing up.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from gpuwarden.core.api import LogChunk
from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.tui.backend import (
    DoctorFinding,
    HistorySeries,
    HostSeries,
    RunDetailView,
    RunRow,
    Snapshot,
    SourceStatus,
)


class FramesReady(Message, bubble=False):
    """The frame buffer has something to read (the frames themselves stay in the buffer)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FramesReady)


@dataclass
class Connected(Message, bubble=False):
    """First load after (re)connecting: who we talk to and everything the overview needs."""

    status: SourceStatus
    gpus: list[GpuStatic]
    snapshot: Snapshot
    runs: list[RunRow]
    # uuid → metric → recent points, to seed the live charts.
    recent: HistorySeries


@dataclass
class RunsLoaded(Message, bubble=False):
    runs: list[RunRow]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsLoaded)


@dataclass
class HealthRead(Message, bubble=False):
    """The daemon's storage fault as a poll found it (None: it writes)."""

    storage_fault: str | None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HealthRead)


@dataclass
class SnapshotLoaded(Message, bubble=False):
    snapshot: Snapshot


class ChartResized(Message):
    """A history chart changed size on its own (a scrollbar came or went): its pane may need
    the window at another resolution."""


@dataclass
class HistoryLoaded(Message, bubble=False):
    window: str
    metrics: tuple[str, ...]
    host_metrics: tuple[str, ...]
    start: float
    end: float
    points: int
    series: HistorySeries  # per GPU UUID, per metric
    host: HostSeries  # per host metric

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HistoryLoaded)


@dataclass
class DetailLoaded(Message, bubble=False):
    detail: RunDetailView


@dataclass
class DoctorLoaded(Message, bubble=False):
    run_id: str
    findings: list[DoctorFinding]


@dataclass
class LogLoaded(Message, bubble=False):
    """A slice of an attempt's log; `heading`: the line that opens the attempt, before it;
    `earlier`: an attempt before the newest, shown on the way to it."""

    run_id: str
    chunk: LogChunk
    heading: str | None = None
    earlier: bool = False


@dataclass
class ControlDone(Message, bubble=False):
    """A control (stop, resume, …) returned; `error` is the one-line refusal, if any."""

    label: str
    error: str | None = None
