"""The dashboard's live state, kept apart from widgets so it is tested without an app.

The stream worker drops frames into a `FrameBuffer` from its thread; the app drains the whole
buffer on the UI thread whenever it gets a (coalesced) `FramesReady` message, folds every frame into
`LiveState` and redraws once. Nothing is lost when messages coalesce: the buffer holds the frames,
the message only says "there is something to read".
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gpuwarden.core.telemetry.types import GpuSample, GpuStatic
from gpuwarden.tui.backend import (
    EventFrame,
    Frame,
    HostTop,
    Point,
    ProcessInfo,
    RunFrame,
    RunRow,
    SampleFrame,
    Snapshot,
    TimelineEvent,
)
from gpuwarden.tui.metrics import CHART_METRICS

SERIES_CAPACITY = 600  # samples kept per chart: 10 minutes at 1 Hz, wider than any terminal x2
MAX_GAP = 30  # missing points filled in as a gap; a longer absence is a reconnect, not a gap


class FrameBuffer:
    """A bounded thread-safe queue of frames. On overflow the oldest sample frames go first;
    run and event frames are small and rare and are kept."""

    def __init__(self, max_samples: int = SERIES_CAPACITY) -> None:
        self._lock = threading.Lock()
        self._frames: deque[Frame] = deque()
        self._samples = 0
        self._max_samples = max_samples
        self.dropped = 0

    def put(self, frame: Frame) -> None:
        with self._lock:
            self._frames.append(frame)
            if isinstance(frame, SampleFrame):
                self._samples += 1
                if self._samples > self._max_samples:
                    self._drop_oldest_sample()

    def _drop_oldest_sample(self) -> None:
        for i, f in enumerate(self._frames):
            if isinstance(f, SampleFrame):
                del self._frames[i]
                self._samples -= 1
                self.dropped += 1
                return

    def drain(self) -> list[Frame]:
        with self._lock:
            frames = list(self._frames)
            self._frames.clear()
            self._samples = 0
        return frames

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)


@dataclass
class EnergyMeter:
    """Energy used since the view opened: from the driver's counter when it has one (exact, and
    survives missed ticks), else by integrating power over time."""

    joules: float = 0.0
    _last_mj: int | None = None
    _last_ts: float | None = None
    _last_w: float | None = None

    def add(self, sample: GpuSample) -> None:
        if sample.lost:
            return
        if sample.energy_mj is not None:
            if self._last_mj is not None:
                delta = sample.energy_mj - self._last_mj
                # A smaller counter means the driver reset it: the new value is what accrued since.
                self.joules += (delta if delta >= 0 else sample.energy_mj) / 1000.0
            self._last_mj = sample.energy_mj
        elif sample.power_w is not None:
            if self._last_ts is not None and self._last_w is not None and sample.ts > self._last_ts:
                self.joules += (sample.power_w + self._last_w) / 2 * (sample.ts - self._last_ts)
            self._last_w = sample.power_w
        self._last_ts = sample.ts


@dataclass
class GpuState:
    static: GpuStatic
    latest: GpuSample | None = None
    series: dict[str, deque[float | None]] = field(default_factory=dict)
    energy: EnergyMeter = field(default_factory=EnergyMeter)
    last_ts: float | None = None
    step: float | None = None  # seconds per point of the history the chart started with: later gaps stay gaps

    def __post_init__(self) -> None:
        for m in CHART_METRICS:
            self.series.setdefault(m.key, deque(maxlen=SERIES_CAPACITY))

    def add(self, sample: GpuSample) -> None:
        if self.last_ts is not None and sample.ts <= self.last_ts:
            return  # a repeated frame after a reconnect: already counted
        if self.last_ts is not None and self.step:
            # Readings the store had not written when the history was read: a gap, so the chart's
            # time stays true instead of the live part joining the history early.
            missing = round((sample.ts - self.last_ts) / self.step) - 1
            for series in self.series.values():
                series.extend([None] * max(0, min(missing, MAX_GAP)))
        self.last_ts = sample.ts
        self.latest = sample
        self.energy.add(sample)
        for m in CHART_METRICS:
            self.series[m.key].append(m.value(sample))


@dataclass
class Changes:
    """What a batch of frames touched, so the app redraws only that."""

    samples: bool = False
    processes: bool = False
    runs: set[str] = field(default_factory=set)
    events: list[TimelineEvent] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)  # in arrival order, for the history


class LiveState:
    """Everything the overview and the runs table show, updated frame by frame."""

    def __init__(self) -> None:
        self.gpus: dict[str, GpuState] = {}
        self.snapshot: Snapshot | None = None
        self.processes: list[ProcessInfo] = []
        self.top: HostTop | None = None  # None until the source answered once
        self.runs: dict[str, RunRow] = {}

    def set_gpus(self, statics: list[GpuStatic]) -> None:
        for s in sorted(statics, key=lambda g: g.index):
            if s.uuid not in self.gpus:
                self.gpus[s.uuid] = GpuState(s)
            else:
                self.gpus[s.uuid].static = s

    def prefill(self, uuid: str, metric: str, points: list[Point]) -> None:
        """Seed a chart with recent history so it is not empty when the view opens."""
        if uuid not in self.gpus:
            return
        state = self.gpus[uuid]
        # A last bucket the store has not written yet is no reading: the live ticks follow on.
        end = len(points)
        while end and points[end - 1].value is None:
            end -= 1
        series = state.series[metric]
        series.clear()
        series.extend(p.value for p in points[:end])
        if end:
            state.last_ts = points[end - 1].ts
            state.step = points[1].ts - points[0].ts if len(points) > 1 else None

    def set_runs(self, runs: list[RunRow]) -> None:
        self.runs = {r.id: r for r in runs}

    def apply(self, frames: list[Frame]) -> Changes:
        changes = Changes()
        for frame in frames:
            if isinstance(frame, SampleFrame):
                self._apply_snapshot(frame.snapshot, changes)
            elif isinstance(frame, RunFrame):
                self.runs[frame.run.id] = frame.run
                changes.runs.add(frame.run.id)
            elif isinstance(frame, EventFrame):
                changes.events.append(frame.event)
        return changes

    def _apply_snapshot(self, snap: Snapshot, changes: Changes) -> None:
        self.snapshot = snap
        changes.samples = True
        changes.snapshots.append(snap)
        for sample in snap.gpus:
            state = self.gpus.get(sample.uuid)
            if state is not None:
                state.add(sample)
        if snap.processes is not None:
            self.processes = snap.processes
            changes.processes = True
        if snap.top is not None:
            self.top = snap.top
            changes.processes = True

    def runs_sorted(self) -> list[RunRow]:
        """Active runs first, then queued, then finished; newest first within each."""
        order = {"running": 0, "starting": 0, "retuning": 0, "queued": 1}
        return sorted(self.runs.values(), key=lambda r: (order.get(r.state, 2), -r.created_at, r.id))
