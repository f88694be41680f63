"""Everything recorded about one run, gathered once from a `RunData` into plain data.

Telemetry is read per attempt window (start to end, or to now for a live attempt) and per GPU the
attempt ran on, at one point per second where the store still holds raw samples (coarser tiers
answer for old runs, and the report says which tier it used).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.exit_record import STATUS_FILE, read_peak_rss
from gpuwarden.core.report.data import RunData, Series
from gpuwarden.core.run_state import FINAL_STATES

GPU_SERIES_METRICS = [
    "util_gpu",
    "util_gpu_fine",
    "power_w",
    "power_limit_w",
    "mem_used",
    "mem_total",
    "temperature_c",
    "throttle_reasons",
]
HOST_SERIES_METRICS = ["cpu_percent"]
# One bucket a second up to this many buckets per window; longer windows get wider buckets.
MAX_POINTS = 5000


@dataclass
class AttemptWindow:
    """One attempt's time window and placement."""

    attempt: int
    start: float
    end: float
    gpus: list[str]
    pid: int | None = None
    state: str | None = None
    classification: str | None = None
    exit_code: int | None = None
    live: bool = False
    # Joules per GPU between the counter readings at its start and end (where both were read).
    counted_j: dict[str, float] = field(default_factory=dict)
    # The program's peak resident set as the kernel counted it, from its exit record (bytes).
    peak_rss: int | None = None

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "started_at": self.start,
            "ended_at": None if self.live else self.end,
            "wall_s": self.wall_s,
            "gpus": self.gpus,
            "pid": self.pid,
            "state": self.state,
            "classification": self.classification,
            "exit_code": self.exit_code,
            "peak_rss": self.peak_rss,
        }


@dataclass
class GpuWindow:
    """Telemetry of one GPU during one attempt."""

    uuid: str
    attempt: int
    start: float
    end: float
    series: Series
    energy_j: float | None = None
    processes: list[dict[str, Any]] | None = None


@dataclass
class RunSnapshot:
    """A run, its attempts, events, retunes and the telemetry of its windows."""

    run: dict[str, Any]
    attempts: list[AttemptWindow]
    events: list[dict[str, Any]]
    retunes: list[dict[str, Any]] = field(default_factory=list)
    gpu_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpus: list[GpuWindow] = field(default_factory=list)
    host: dict[int, Series] = field(default_factory=dict)  # attempt → host series
    source: str = ""

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.run.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def kind(self) -> str:
        return str(self.run.get("kind", ""))

    def runner_events(self, type_: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Events a runner wrote, of one type, optionally of one attempt (oldest first)."""
        return [
            e
            for e in self.events
            if e.get("type") == type_
            and e.get("source", "runner") == "runner"
            and (attempt is None or e.get("attempt") == attempt)
        ]

    def started(self, attempt: int) -> dict[str, Any] | None:
        found = self.runner_events("started", attempt)
        return found[-1] if found else None

    def first_progress_ts(self, attempt: int) -> float | None:
        found = self.runner_events("progress", attempt)
        return float(found[0]["ts"]) if found else None


def _window(row: dict[str, Any], events: list[dict[str, Any]], run_final: bool, now: float) -> AttemptWindow:
    number = int(row["attempt"])
    own = [
        float(e["ts"]) for e in events if e.get("attempt") == number and isinstance(e.get("ts"), int | float)
    ]
    start = row.get("started_at")
    if start is None:
        start = min(own) if own else now
    end = row.get("ended_at")
    live = end is None and row.get("state") != "ended" and not run_final
    if end is None:
        end = now if live else (max(own) if own else float(start))
    gpus = row.get("gpus") or []
    return AttemptWindow(
        attempt=number,
        start=float(start),
        end=float(end),
        gpus=[str(g) for g in gpus],
        pid=row.get("pid"),
        state=row.get("state"),
        classification=row.get("classification"),
        exit_code=row.get("exit_code"),
        live=live,
        counted_j={str(k): float(v) for k, v in (row.get("gpu_energy_j") or {}).items()},
        peak_rss=_peak_rss(row),
    )


def _peak_rss(row: dict[str, Any]) -> int | None:
    """The attempt's peak resident set: the API's figure, else its exit record beside its output
    (a store or run folder read on the machine that ran it)."""
    if isinstance(row.get("peak_rss"), int):
        return int(row["peak_rss"])
    if row.get("state") != "ended" or not row.get("stderr_path"):
        return None
    return read_peak_rss(str(Path(str(row["stderr_path"])).parent / STATUS_FILE))


def points_for(start: float, end: float) -> int:
    """Buckets for a window: one a second, at most MAX_POINTS."""
    return max(1, min(MAX_POINTS, math.ceil(end - start)))


def collect_run(data: RunData, ref: str, now: float | None = None) -> RunSnapshot:
    """Read one run and the telemetry of its attempts' windows from `data`."""
    clock = time.time() if now is None else now
    run = data.resolve_run(ref)
    run_id = str(run["id"])
    events = data.events(run_id)
    final = run.get("state") in FINAL_STATES
    attempts = [_window(a, events, final, clock) for a in data.attempts(run_id)]
    info = {str(g["uuid"]): g for g in data.gpu_info()}
    snapshot = RunSnapshot(
        run=run,
        attempts=attempts,
        events=events,
        retunes=data.retunes(run_id),
        gpu_info=info,
        source=data.source,
    )
    for window in attempts:
        if window.end <= window.start:
            continue
        points = points_for(window.start, window.end)
        snapshot.host[window.attempt] = data.host_series(
            HOST_SERIES_METRICS, window.start, window.end, points
        )
        for uuid in window.gpus:
            snapshot.gpus.append(
                GpuWindow(
                    uuid=uuid,
                    attempt=window.attempt,
                    start=window.start,
                    end=window.end,
                    series=data.gpu_series(uuid, GPU_SERIES_METRICS, window.start, window.end, points),
                    energy_j=window.counted_j[uuid]
                    if uuid in window.counted_j
                    else data.energy(uuid, window.start, window.end),
                    processes=data.processes(uuid, window.start, window.end),
                )
            )
    return snapshot
