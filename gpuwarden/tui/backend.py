"""What the dashboard needs from its data source, as a Protocol over the API's own models.

The dashboard is a client of the daemon's API only; this module names exactly the calls it makes,
so the app can be driven by the real API (`ApiBackend`), by an existing database opened read-only
(`DbBackend`) or by a deterministic fake in tests (`tests/tui/fake_backend.py`) without patching
anything. Runs, attempts, retunes, metrics and log chunks are the API's models
(`gpuwarden.core.api`) whichever backend answers; the types here are the dashboard's own views.

Every call may block (network, disk): the app only makes them from thread workers. Failures a user
can act on are raised as `UserError` whose message is shown as one line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from pydantic import ConfigDict

from gpuwarden.client.fleet_view import FleetGpu
from gpuwarden.client.hosts import HostAnswer
from gpuwarden.core.api import Attempt, LogChunk, Retune, RunMetric, RunSummary
from gpuwarden.core.progress_bar import BarReading
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample


class Point(NamedTuple):
    """One point of a history chart: a bucket's middle, its mean and its largest reading (the
    store's rollups keep both; None where nothing was recorded)."""

    ts: float
    value: float | None
    peak: float | None = None


# gpu uuid → metric → points, oldest first, evenly spaced.
HistorySeries = dict[str, dict[str, list[Point]]]
# host metric → points.
HostSeries = dict[str, list[Point]]


@dataclass(frozen=True)
class SourceStatus:
    """Where the data comes from, shown in the status bar."""

    source: str  # "daemon", "database" or "fake"
    location: str  # socket or database path, for the status bar
    host: str = ""  # the machine the data is about, when known
    # None while GPUs are sampled; else the daemon's one line saying why not (no driver, …).
    sampling: str | None = None
    version: str | None = None
    # False when the source cannot act at all (a database): the app then hides every control.
    controls: bool = True
    # What the daemon cannot write now (its database or state folder), in one line with the fix;
    # None while it writes, and always for a database (nothing writes to it here).
    storage_fault: str | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """A process holding GPU memory, with the run it belongs to when the daemon started it."""

    pid: int
    uuid: str
    gpu_index: int | None
    user: str | None
    used_memory: int | None
    command: str
    run_id: str | None = None
    # The dashboard's user owns it, so the daemon will let them terminate it.
    owned: bool = False


@dataclass(frozen=True)
class TopProcess:
    """One of the host's heaviest processes, as the overview lists it."""

    pid: int
    user: str | None  # None where another user's process does not say
    cpu_percent: float | None  # of one core (above 100 on several); None before it was measured
    rss: int | None
    command: str
    run_id: str | None = None
    owned: bool = False  # the dashboard's user's own
    host: str | None = None  # the machine it runs on, when the dashboard shows several


@dataclass(frozen=True)
class HostTop:
    """The host's heaviest processes by CPU and by memory, or why the source cannot list them."""

    processes: list[TopProcess] = field(default_factory=list)
    unavailable: str | None = None  # one line: why there is no list (a database keeps none)


@dataclass
class Snapshot:
    """The latest reading of everything on the overview."""

    ts: float
    gpus: list[GpuSample] = field(default_factory=list)
    host: HostSample | None = None
    # None on ticks that did not read processes: the table then keeps what it shows.
    processes: list[ProcessInfo] | None = None
    # The host's heaviest processes, read with the GPU processes (None when they were not).
    top: HostTop | None = None


class RunRow(RunSummary):
    """One row of the runs table: the API's run summary, plus where the current attempt runs and
    how far it has come (read from the run's progress events)."""

    model_config = ConfigDict(frozen=True)

    placed: tuple[int, ...] = ()  # indices of the GPUs the latest attempt runs on
    pid: int | None = None  # the latest attempt's process (group leader)
    samples_seen: float | None = None
    total: float | None = None
    samples_per_s: float | None = None
    retunes: int = 0
    host: str | None = None  # the machine it runs on, when the dashboard shows several


def reported_number(value: Any) -> float | None:
    """A number a run reported (a script may send anything: what is not a number is unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


# Events folded into the run's row (its Progress, ETA and rate), not lines of its timeline.
FOLDED_EVENTS = frozenset({"progress", "progress_bar"})


def bar_progress(bar: BarReading) -> tuple[float, float | None, float | None]:
    """A run's (done, total, rate) from the progress bar it draws: the bar's count in its own
    unit. An epoch's bar has no total here: its end is the epoch's, not the run's."""
    return bar.n, None if bar.counts_an_epoch else bar.total, bar.rate


def run_row(summary: RunSummary, **view: Any) -> RunRow:
    """The row for `summary` (a RunDetail's summary part too) with the view's own fields."""
    return RunRow.model_validate(
        {**{name: getattr(summary, name) for name in RunSummary.model_fields}, **view}
    )


@dataclass(frozen=True)
class TimelineEvent:
    """A run event as one line of the run's timeline."""

    id: int
    run_id: str
    attempt: int | None
    ts: float
    type: str
    text: str
    source: str = "runner"
    phase: str | None = None  # a `probe` event's: started, running, ended


@dataclass(frozen=True)
class RunDetailView:
    """What the run screen shows: the run, its attempts and retunes as the API gives them, the
    timeline and the progress metrics."""

    run: RunRow
    spec: dict[str, Any]
    attempts: list[Attempt]
    retunes: list[Retune]
    events: list[TimelineEvent]
    metrics: list[RunMetric]
    # Memory of the smallest card the run uses, for the peak-memory chart's ceiling.
    mem_capacity: int | None = None
    # GPU UUID → index, to name the GPUs of each attempt as the rest of the dashboard does.
    gpu_index: dict[str, int] = field(default_factory=dict)
    # attempt → where its `oom` event says memory ran out (forward, backward, optimizer …).
    oom_phases: dict[int, str] = field(default_factory=dict)
    # The run's report.json once written (throughput, memory, energy per sample …).
    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class DoctorFinding:
    """One doctor finding about a run, flattened for display."""

    severity: str  # error | warning | info
    title: str
    evidence: str
    fix: str


def doctor_findings(diagnosis_dict: dict[str, Any]) -> list[DoctorFinding]:
    """Flatten `Diagnosis.to_dict()` for the run detail's doctor tab."""
    out: list[DoctorFinding] = []
    for f in diagnosis_dict.get("findings", []):
        evidence = ", ".join(f"{k}={v}" for k, v in (f.get("evidence") or {}).items() if k not in ("where",))
        fix = f.get("fix")
        fix_text = ", ".join(f"{k}: {v}" for k, v in fix.items()) if isinstance(fix, dict) else str(fix or "")
        out.append(DoctorFinding(str(f.get("severity")), str(f.get("title")), evidence, fix_text))
    return out


@dataclass(frozen=True)
class SampleFrame:
    snapshot: Snapshot


@dataclass(frozen=True)
class RunFrame:
    run: RunRow


@dataclass(frozen=True)
class EventFrame:
    event: TimelineEvent


Frame = SampleFrame | RunFrame | EventFrame


class DashboardBackend(Protocol):
    """The calls the dashboard makes. All may block; controls raise UserError on refusal."""

    def status(self) -> SourceStatus: ...

    def storage_fault(self) -> str | None:
        """`SourceStatus.storage_fault` as it is now (the app asks every few seconds)."""
        ...

    def gpus(self) -> list[GpuStatic]: ...

    def snapshot(self) -> Snapshot: ...

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        """At most `points` values per series between `start` and `end`, from the rollup tier that
        fits the window."""
        ...

    def host_history(
        self, metrics: Sequence[str], start: float, end: float, points: int
    ) -> dict[str, list[Point]]:
        """The host's series (HOST_METRICS names), like `history`; {} where none was recorded."""
        ...

    def runs(self) -> list[RunRow]: ...

    def run_detail(self, run_id: str) -> RunDetailView: ...

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        """Doctor's findings on the run (its spec and its recorded telemetry)."""
        ...

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        """An attempt's log (the newest one's when `attempt` is None) from `offset`; a negative
        offset means "the last -offset bytes" (`next_offset` is where the next read starts,
        `overflow` says the start was skipped)."""
        ...

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        """Live updates until `stop` is set: a sample frame each tick, run and event frames as
        they happen. Returns when the stream ends (the caller reconnects)."""
        ...

    def stop_run(self, run_id: str) -> None: ...

    def resume_run(self, run_id: str) -> None: ...

    def submit(self, spec_path: str) -> str:
        """Submit the spec file at `spec_path`; returns the new run's id."""
        ...

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        """Change knobs of a run's spec (dotted keys → values) and start it again."""
        ...

    def rerun(self, run_id: str, typed: dict[str, Any]) -> str:
        """Submit a new run from the run's spec as it last ran, with the knobs `typed` (named as a
        person types them: `batch_size`, a command run's own knob, a dotted key) changed; the new
        run's id. The old run is left as it is."""
        ...

    def tune(self, run_id: str) -> None:
        """Ask the daemon to search better settings for this run's spec (tune-up)."""
        ...

    def kill_process(self, pid: int) -> None:
        """Terminate a GPU process the user owns."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class HostsSource(Protocol):
    """A backend over several hosts (`gpuwarden tui --host …`): the dashboard adds its hosts tab."""

    host_names: list[str]

    def gpu_rows(self) -> list[HostAnswer[list[FleetGpu]]]:
        """Every host's GPUs, or the line saying why a host shows none."""
        ...

    def submit_to(self, host: str, spec_path: str) -> str:
        """Submit the spec file at `spec_path` (on this machine) to `host`; the new run's id."""
        ...
