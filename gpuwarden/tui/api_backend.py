"""`DashboardBackend` over the daemon's HTTP API (`gpuwarden.client.ApiClient`).

The client answers with the API's models; this adapter adds what the dashboard shows beyond
them: run progress and throughput come from the runs' `progress` events (read once per active
run, then followed on the stream), and the processes table is refreshed every few sample frames
because the stream's sample frames do not include processes.
"""

from __future__ import annotations

import dataclasses
import getpass
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from gpuwarden.client import ApiClient, StreamFrame
from gpuwarden.core.api import (
    HistoryAnswer,
    LogChunk,
    RankedProcess,
    RunDetail,
    RunEvent,
    RunSummary,
    SampleBody,
)
from gpuwarden.core.api.telemetry import Bucket
from gpuwarden.core.config.yamlsource import read_yaml_text
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.explain import oom_phases
from gpuwarden.core.progress_bar import recorded_bar
from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.core.units import size
from gpuwarden.tui.backend import (
    FOLDED_EVENTS,
    DoctorFinding,
    EventFrame,
    Frame,
    HistorySeries,
    HostSeries,
    HostTop,
    Point,
    ProcessInfo,
    RunDetailView,
    RunFrame,
    RunRow,
    SampleFrame,
    Snapshot,
    SourceStatus,
    TimelineEvent,
    TopProcess,
    bar_progress,
    doctor_findings,
    reported_number,
    run_row,
)
from gpuwarden.tui.rerun_spec import rerun_spec

PROCESS_EVERY = 5  # sample frames between two process reads
TOP_COUNT = 20  # the host's busiest processes read, and as many of the largest in memory
EVENT_PAGE = 1000
SETTLE_PER_CALL = 10  # finished runs read per runs() call: the newest first, the rest on later polls


OLD_DAEMON_TOP = (
    "host processes: this daemon does not list them — restart it with this version "
    "(`gpuwarden down && gpuwarden up`)"
)


def top_process(p: RankedProcess, user: str) -> TopProcess:
    """The overview's row for a process the daemon ranked among the heaviest."""
    command = p.cmdline or p.name or "?"
    return TopProcess(p.pid, p.user, p.cpu_percent, p.rss, command, p.run_id, owned=p.user == user)


def series_from_buckets(buckets: Sequence[Bucket], start: float, step: float, points: int) -> list[Point]:
    """Evenly spaced points (mean and max) from the store's (bucket start, avg, min, max) rows; a
    bucket the store left out (no reading) becomes None, so gaps show as gaps."""
    slots = [Point(start + (k + 0.5) * step, None) for k in range(points)]
    for row in buckets:
        k = math.floor((row[0] - start) / step + 1e-6) if step > 0 else 0
        if 0 <= k < points:
            slots[k] = Point(slots[k].ts, row[1], row[3])
    return slots


def buckets_to_series(answer: HistoryAnswer, start: float, end: float, points: int) -> HistorySeries:
    """A history answer (over the API or from the store) as evenly spaced points per series key
    (a GPU UUID or "host") and metric."""
    step = answer.step or (end - start) / points
    first = answer.start
    # The store's last bucket may be partial (it ends at `end`): it still counts.
    count = max(1, min(points, math.ceil((answer.end - first) / step - 1e-9)))
    return {
        key: {m: series_from_buckets(rows, first, step, count) for m, rows in by_metric.items()}
        for key, by_metric in answer.series.items()
    }


def _started_text(e: dict[str, Any]) -> str:
    return f"{e.get('device', '?')} {e.get('dtype', '')}" + (" (resumed)" if e.get("resumed_from") else "")


def _edited_text(e: dict[str, Any]) -> str:
    if not isinstance(e.get("changes"), dict):
        return ""
    return "changed " + ", ".join(
        f"{k} {v[0]} → {v[1]}" if isinstance(v, list) and len(v) == 2 else f"{k} → {v}"
        for k, v in e["changes"].items()
    )


def _fixed_memory_text(e: dict[str, Any]) -> str:
    return (
        f"at least {size(e.get('fixed_bytes'))} whatever the batch ({size(e.get('held_bytes'))} held, "
        f"{size(e.get('gradient_bytes'))} gradients and {size(e.get('optimizer_state_bytes'))} "
        "optimizer state to come)"
    )


# One line for the timeline, per event type; others show their message or reason.
_EVENT_TEXTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "state": lambda e: f"{e.get('state')}" + (f": {e['message']}" if e.get("message") else ""),
    "oom": lambda e: f"out of memory ({e.get('verdict', '?')}, {e.get('phase') or 'unknown phase'})",
    "error": lambda e: f"{e.get('code', '')}: {e.get('message', '')}",
    "warning": lambda e: f"{e.get('code', '')}: {e.get('message', '')}",
    "started": _started_text,
    "checkpoint": lambda e: f"step {e.get('step')} ({e.get('reason', 'interval')})",
    "progress": lambda e: f"step {e.get('step')} samples {e.get('samples_seen')}",
    "finished": lambda e: "finished",
    "retuned": lambda e: str(e.get("reason") or ""),
    "edited": _edited_text,
    "fixed_memory": _fixed_memory_text,
}


def event_text(event: RunEvent) -> str:
    """One line for the timeline from a stored or streamed event."""
    e = event.model_dump()
    text = _EVENT_TEXTS.get(event.type)
    return text(e) if text is not None else str(e.get("message") or e.get("reason") or "")


def timeline_event(event: RunEvent, run_id: str) -> TimelineEvent:
    return TimelineEvent(
        id=event.id,
        run_id=run_id,
        attempt=event.attempt,
        ts=event.ts,
        type=event.type,
        text=event_text(event),
        source=event.source,
        phase=_phase(event),
    )


def _phase(event: RunEvent) -> str | None:
    phase = (event.model_extra or {}).get("phase")
    return phase if event.type == "probe" and isinstance(phase, str) else None


@dataclasses.dataclass
class _Progress:
    """The newest progress event of a run and how many retunes it has had."""

    since: int = 0
    samples_seen: float | None = None
    total: float | None = None
    samples_per_s: float | None = None
    retunes: int = 0
    own: bool = False  # the run reports its progress itself: the bar it draws is not read


class ApiBackend:
    """Reads through one `ApiClient`; every method may block on the socket."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self._statics: dict[str, GpuStatic] = {}
        self._progress: dict[str, _Progress] = {}
        self._final_retunes: dict[str, int] = {}
        self._placed: dict[str, tuple[int, list[str], int | None]] = {}  # run id → (attempt, GPUs, pid)
        self._settled: set[str] = set()  # finished runs whose last progress has been read
        self._lock = threading.Lock()
        self._user = getpass.getuser()

    # -- telemetry ---------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        health = self.client.health()
        gpus = self.gpus()
        return SourceStatus(
            "daemon",
            health.socket or str(self.client.socket_path),
            # A Unix socket is served on this machine: its name is the daemon's host.
            host=socket.gethostname(),
            sampling=None if gpus else health.gpu_status or "no GPU",
            version=health.version,
            storage_fault=health.fault,
        )

    def storage_fault(self) -> str | None:
        return self.client.health().fault

    def gpus(self) -> list[GpuStatic]:
        statics: list[GpuStatic] = list(self.client.gpus().gpus)
        with self._lock:
            self._statics = {g.uuid: g for g in statics}
        return statics

    def _index(self, uuid: str) -> int | None:
        static = self._statics.get(uuid)
        return static.index if static else None

    def _indices(self, uuids: Sequence[str]) -> tuple[int, ...]:
        return tuple(i for i in (self._index(u) for u in uuids) if i is not None)

    def _processes(self) -> list[ProcessInfo]:
        return [
            ProcessInfo(
                pid=p.pid,
                uuid=p.uuid,
                gpu_index=self._index(p.uuid),
                user=p.user,
                used_memory=p.used_memory,
                command=p.cmdline or p.name or "?",
                run_id=p.run_id,
                owned=p.user == self._user,
            )
            for p in self.client.processes()
        ]

    def _top(self) -> HostTop:
        try:
            answer = self.client.host_processes(TOP_COUNT)
        except UserError as exc:
            if exc.code != "not_found":
                raise
            return HostTop(unavailable=OLD_DAEMON_TOP)  # the rest of the dashboard works with it
        return HostTop([top_process(p, self._user) for p in answer.processes])

    def snapshot(self) -> Snapshot:
        data = self.client.gpus()
        samples = [g.sample for g in data.gpus if g.sample is not None]
        host = self.client.host().host
        ts = data.ts or (host.ts if host else 0.0)
        return Snapshot(ts, samples, host, self._processes(), self._top())

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        answer = self.client.history(
            window=f"{max(1.0, end - start):.0f}s", metrics=metrics, gpus=gpus, points=points, end=end
        )
        return buckets_to_series(answer, start, end, points)

    def host_history(self, metrics: Sequence[str], start: float, end: float, points: int) -> HostSeries:
        answer = self.client.history(
            window=f"{max(1.0, end - start):.0f}s", metrics=metrics, points=points, end=end, host=True
        )
        return buckets_to_series(answer, start, end, points).get("host", {})

    # -- runs --------------------------------------------------------------------------------

    def _placement(self, run: RunSummary) -> tuple[int, ...]:
        """The GPUs the latest attempt runs on; else the GPUs the spec names by index."""
        if isinstance(run, RunDetail):
            placed = run.attempts[-1].gpus if run.attempts else []
        else:
            placed = self._placed.get(run.id, (0, [], None))[1]
        if placed:
            return self._indices(placed)
        if isinstance(run.gpus, list):
            return tuple(int(g) for g in run.gpus if g.isdigit())
        return ()

    def _summary(self, run: RunSummary) -> RunRow:
        progress = self._progress.get(run.id, _Progress())
        active = run.state in ACTIVE_STATES
        retunes = progress.retunes
        if isinstance(run, RunDetail):
            retunes = len(run.retunes)
        elif not active and run.id in self._final_retunes:
            retunes = self._final_retunes[run.id]
        pid = self._placed.get(run.id, (0, [], None))[2]
        if isinstance(run, RunDetail) and run.attempts:
            pid = run.attempts[-1].program_pid or run.attempts[-1].pid
        return run_row(
            run,
            placed=self._placement(run),
            pid=pid if active else None,
            samples_seen=progress.samples_seen,
            total=progress.total,
            samples_per_s=progress.samples_per_s if active else None,
            retunes=retunes,
        )

    def _note_event(self, run_id: str, event: RunEvent) -> None:
        extra = event.model_extra or {}
        with self._lock:
            p = self._progress.setdefault(run_id, _Progress())
            p.since = max(p.since, event.id)
            if event.type == "progress":
                p.own = True
                p.samples_seen = reported_number(extra.get("samples_seen", p.samples_seen))
                p.total = reported_number(extra.get("total", p.total))
                p.samples_per_s = reported_number(extra.get("samples_per_s", p.samples_per_s))
            elif event.type == "progress_bar" and not p.own and (bar := recorded_bar(extra)):
                p.samples_seen, p.total, p.samples_per_s = bar_progress(bar)
            elif event.type == "state" and extra.get("state") == RunState.RETUNING:
                p.retunes += 1  # the daemon records each retune as a move to `retuning`

    def _catch_up(self, run_id: str) -> None:
        """Read the events of an active run we have not seen yet (its progress lives there)."""
        while True:
            since = self._progress.get(run_id, _Progress()).since
            page = self.client.events(run_id, since=since, limit=EVENT_PAGE)
            for event in page.events:
                self._note_event(run_id, event)
            if len(page.events) < EVENT_PAGE:
                return

    def runs(self) -> list[RunRow]:
        rows = self.client.runs()
        settle = SETTLE_PER_CALL
        for r in rows:
            placed = self._placed.get(r.id)
            if r.attempt and (placed is None or placed[0] != r.attempt or placed[2] is None):
                # The list has no placement: read it once per attempt (it cannot change within one).
                attempts = self.client.attempts(r.id)
                last = attempts[-1] if attempts else None
                pid = (last.program_pid or last.pid) if last else None
                self._placed[r.id] = (r.attempt, list(last.gpus) if last else [], pid)
            if r.state in ACTIVE_STATES:
                self._catch_up(r.id)
                self._settled.discard(r.id)
            elif r.id not in self._settled and settle > 0:
                # A run that is not active no longer changes: read its last progress and count its
                # retunes once, a few runs per call so a long history does not delay the first view.
                settle -= 1
                self._catch_up(r.id)
                self._final_retunes[r.id] = len(self.client.retunes(r.id))
                self._settled.add(r.id)
        return [self._summary(r) for r in rows]

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        from gpuwarden.client.run_data import ApiRunData
        from gpuwarden.core.doctor.diagnose import diagnose_run

        return doctor_findings(diagnose_run(ApiRunData(self.client), run_id).to_dict())

    def _timeline(self, run_id: str) -> list[RunEvent]:
        """Every event but progress: those are many and become the charts."""
        events: list[RunEvent] = []
        since = 0
        while True:
            page = self.client.events(run_id, since=since, limit=EVENT_PAGE)
            events += [e for e in page.events if e.type not in FOLDED_EVENTS]
            if len(page.events) < EVENT_PAGE:
                return events
            since = page.next_since

    def run_detail(self, run_id: str) -> RunDetailView:
        detail = self.client.run(run_id)
        self._catch_up(detail.id)
        events = self._timeline(detail.id)
        used = detail.attempts[-1].gpus if detail.attempts else []
        capacities = [self._statics[u].memory_total for u in used if u in self._statics]
        return RunDetailView(
            self._summary(detail),
            detail.spec,
            detail.attempts,
            detail.retunes,
            [timeline_event(e, detail.id) for e in events],
            self.client.metrics(detail.id),
            min((c for c in capacities if c), default=None),
            {uuid: static.index for uuid, static in self._statics.items()},
            oom_phases(events),
            detail.report,
        )

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        return self.client.logs(run_id, stream=stream, attempt=attempt, offset=offset)

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        ticks = 0
        stream = self.client.stream()
        try:
            for frame in stream:
                if stop.is_set():
                    return
                if frame.event == "sample":
                    ticks += 1
                try:
                    out = self._frame(frame, ticks)
                except ValidationError:
                    continue  # a frame this dashboard cannot read: the next poll brings the state
                if out is not None:
                    yield out
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def _frame(self, frame: StreamFrame, ticks: int) -> Frame | None:
        if frame.event == "sample":
            body = SampleBody.model_validate(frame.data)
            if ticks % PROCESS_EVERY:
                return SampleFrame(Snapshot(body.ts, body.gpus, body.host))
            return SampleFrame(Snapshot(body.ts, body.gpus, body.host, self._processes(), self._top()))
        if frame.event == "run":
            return RunFrame(self._summary(RunSummary.model_validate(frame.data)))
        if frame.event == "event":
            run_id = str(frame.data.get("run_id", ""))
            # Notes the daemon makes about a run are streamed without their time: it is now.
            event = RunEvent.model_validate({"ts": time.time(), **frame.data})
            self._note_event(run_id, event)
            if event.type not in FOLDED_EVENTS:
                return EventFrame(timeline_event(event, run_id))
        return None

    # -- controls ----------------------------------------------------------------------------

    def stop_run(self, run_id: str) -> None:
        self.client.stop(run_id)

    def resume_run(self, run_id: str) -> None:
        self.client.resume(run_id)

    def submit(self, spec_path: str) -> str:
        path = Path(spec_path).expanduser()
        text = read_yaml_text(path)
        # The dashboard runs in the user's shell: its runs get that shell's environment, as
        # `gpuwarden run` gives them.
        return self.client.submit_yaml(text, path.parent, str(path), environment=os.environ).id

    def rerun(self, run_id: str, typed: dict[str, Any]) -> str:
        """As `gpuwarden rerun` does: the run's spec as it last ran, the knobs changed, submitted
        with this shell's environment."""
        old = self.client.run(run_id)
        document = rerun_spec(str(old.kind), old.spec, typed)
        return self.client.submit(document, environment=os.environ).id

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        """Edit the run (dotted keys such as `train.batch_size` change the spec itself, plain
        names the command run's `knobs`), then start it again. An active run must be stopped
        first; the edit lands before the resume, so the next attempt always has it."""
        run = self.client.run(run_id)
        if run.state in ACTIVE_STATES:
            raise UserError(f"run {run.name} is {run.state}: stop it first (s), then change it")
        dotted = {k: v for k, v in changes.items() if "." in k}
        plain = {k: v for k, v in changes.items() if "." not in k}
        edit: dict[str, Any] = {}
        if dotted:
            edit["set"] = dotted
        if plain:
            edit["knobs"] = plain  # the daemon keeps the knobs not named
        self.client.edit(run_id, **edit)
        if run.state != RunState.QUEUED:
            self.client.resume(run_id)

    def tune(self, run_id: str) -> None:
        """The daemon probes for the fastest micro-batch before the run's next attempt."""
        self.client.tune(run_id)

    def kill_process(self, pid: int) -> None:
        """SIGTERM a stray GPU process of this user through the daemon (SIGKILL after a grace
        period); the daemon refuses processes of runs and of other users."""
        self.client.terminate_process(pid)

    def close(self) -> None:
        self.client.close()
