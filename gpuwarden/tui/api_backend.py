"""`DashboardBackend` over the daemon's HTTP API (`gpuwarden.client.ApiClient`).

The API speaks JSON dicts; this adapter turns them into the dashboard's records and fills in
what the list endpoints do not carry: run progress and throughput come from the runs' `progress`
events (read once per active run, then followed on the stream), and the processes table is
refreshed every few sample frames because the stream's sample frames do not include processes.
"""

from __future__ import annotations

import dataclasses
import getpass
import math
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.client import ApiClient
from gpuwarden.core.config.yamlsource import read_yaml_text
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import ACTIVE_STATES
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample
from gpuwarden.tui.backend import (
    AttemptInfo,
    DoctorFinding,
    EventFrame,
    Frame,
    HistorySeries,
    LogChunk,
    ProcessInfo,
    RetuneInfo,
    RunDetail,
    RunEvent,
    RunFrame,
    RunMetric,
    RunSummary,
    SampleFrame,
    Snapshot,
    SourceStatus,
    doctor_findings,
)

PROCESS_EVERY = 5  # sample frames between two process reads
EVENT_PAGE = 1000


def _fields(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that `cls` (a dataclass) accepts: newer daemons may send more."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def gpu_static(d: dict[str, Any]) -> GpuStatic:
    fields = _fields(GpuStatic, d)
    fields["unsupported"] = tuple(d.get("unsupported") or ())
    return GpuStatic(**fields)


def gpu_sample(d: dict[str, Any]) -> GpuSample:
    return GpuSample(**_fields(GpuSample, d))


def host_sample(d: dict[str, Any] | None) -> HostSample | None:
    return HostSample(**_fields(HostSample, d)) if d else None


def series_from_buckets(
    buckets: list[list[float]], start: float, step: float, points: int
) -> list[tuple[float, float | None]]:
    """Evenly spaced (ts, avg) points from the store's (bucket start, avg, min, max) rows; a
    bucket the store left out (no reading) becomes None, so gaps show as gaps."""
    slots: list[tuple[float, float | None]] = [(start + (k + 0.5) * step, None) for k in range(points)]
    for row in buckets:
        k = math.floor((row[0] - start) / step + 1e-6) if step > 0 else 0
        if 0 <= k < points:
            slots[k] = (slots[k][0], row[1])
    return slots


def buckets_to_series(answer: dict[str, Any], start: float, end: float, points: int) -> HistorySeries:
    """A history answer (the store's `History.to_dict()`, over the API or not) as evenly spaced
    points per series key (a GPU UUID or "host") and metric."""
    step = float(answer.get("step") or (end - start) / points)
    first = float(answer.get("start", start))
    # The store's last bucket may be partial (it ends at `end`): it still counts.
    count = max(1, min(points, math.ceil((float(answer.get("end", end)) - first) / step - 1e-9)))
    return {
        key: {m: series_from_buckets(rows, first, step, count) for m, rows in by_metric.items()}
        for key, by_metric in answer.get("series", {}).items()
    }


def event_text(e: dict[str, Any]) -> str:
    """One line for the timeline from a stored or streamed event."""
    kind = str(e.get("type", "?"))
    if kind == "state":
        return f"{e.get('state')}" + (f": {e['message']}" if e.get("message") else "")
    if kind == "oom":
        return f"out of memory ({e.get('verdict', '?')}, {e.get('phase') or 'unknown phase'})"
    if kind in ("error", "warning"):
        return f"{e.get('code', '')}: {e.get('message', '')}"
    if kind == "started":
        return f"{e.get('device', '?')} {e.get('dtype', '')}" + (
            " (resumed)" if e.get("resumed_from") else ""
        )
    if kind == "checkpoint":
        return f"step {e.get('step')} ({e.get('reason', 'interval')})"
    if kind == "progress":
        return f"step {e.get('step')} samples {e.get('samples_seen')}"
    if kind == "finished":
        return "finished"
    return str(e.get("message") or e.get("reason") or "")


def run_event(e: dict[str, Any], run_id: str | None = None) -> RunEvent:
    return RunEvent(
        id=int(e.get("id") or 0),
        run_id=str(e.get("run_id") or run_id or ""),
        attempt=e.get("attempt"),
        ts=float(e.get("ts") or 0.0),
        type=str(e.get("type", "?")),
        text=event_text(e),
        source=str(e.get("source", "runner")),
    )


@dataclasses.dataclass
class _Progress:
    """The newest progress event of a run and how many retunes it has had."""

    since: int = 0
    samples_seen: int | None = None
    total: int | None = None
    samples_per_s: float | None = None
    retunes: int = 0


class ApiBackend:
    """Reads through one `ApiClient`; every method may block on the socket."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        self._statics: dict[str, GpuStatic] = {}
        self._progress: dict[str, _Progress] = {}
        self._final_retunes: dict[str, int] = {}
        self._placed: dict[str, tuple[int, list[str]]] = {}  # run id → (attempt, GPU UUIDs)
        self._lock = threading.Lock()
        self._user = getpass.getuser()

    # -- telemetry ---------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        health = self.client.health()
        gpus = self.gpus()
        return SourceStatus(
            "daemon",
            str(health.get("socket") or self.client.socket_path),
            sampling=None if gpus else str(health.get("gpu_status") or "no GPU"),
            version=str(health.get("version")),
        )

    def gpus(self) -> list[GpuStatic]:
        statics = [gpu_static(g) for g in self.client.gpus().get("gpus", [])]
        with self._lock:
            self._statics = {g.uuid: g for g in statics}
        return statics

    def _index(self, uuid: str) -> int | None:
        static = self._statics.get(uuid)
        return static.index if static else None

    def _processes(self) -> list[ProcessInfo]:
        out = []
        for p in self.client.processes():
            uuid = str(p.get("uuid", ""))
            command = str(p.get("cmdline") or p.get("name") or "?")
            out.append(
                ProcessInfo(
                    pid=int(p["pid"]),
                    uuid=uuid,
                    gpu_index=self._index(uuid),
                    user=p.get("user"),
                    used_memory=p.get("used_memory"),
                    command=command,
                    run_id=p.get("run_id"),
                    owned=p.get("user") == self._user,
                )
            )
        return out

    def snapshot(self) -> Snapshot:
        data = self.client.gpus()
        samples = [gpu_sample(g["sample"]) for g in data.get("gpus", []) if g.get("sample")]
        host = host_sample(self.client.host().get("host"))
        ts = float(data.get("ts") or (host.ts if host else 0.0))
        return Snapshot(ts, samples, host, self._processes())

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        answer = self.client.history(
            window=f"{max(1.0, end - start):.0f}s", metrics=metrics, gpus=gpus, points=points, end=end
        )
        return buckets_to_series(answer, start, end, points)

    def host_history(
        self, metrics: Sequence[str], start: float, end: float, points: int
    ) -> dict[str, list[tuple[float, float | None]]]:
        answer = self.client.history(
            window=f"{max(1.0, end - start):.0f}s", metrics=metrics, points=points, end=end, host=True
        )
        return buckets_to_series(answer, start, end, points).get("host", {})

    # -- runs --------------------------------------------------------------------------------

    def _summary(self, d: dict[str, Any]) -> RunSummary:
        progress = self._progress.get(str(d["id"]), _Progress())
        gpus: tuple[int, ...] = ()
        attempts = d.get("attempts")
        placed = attempts[-1].get("gpus") if attempts else self._placed.get(str(d["id"]), (0, []))[1]
        if placed:
            gpus = tuple(i for i in (self._index(u) for u in placed) if i is not None)
        elif isinstance(d.get("gpus"), list):
            gpus = tuple(int(g) for g in d["gpus"] if isinstance(g, int) or str(g).isdigit())
        retunes = d.get("retunes")
        retune_count = progress.retunes
        if d.get("state") not in ACTIVE_STATES and str(d["id"]) in self._final_retunes:
            retune_count = self._final_retunes[str(d["id"])]
        return RunSummary(
            id=str(d["id"]),
            name=str(d.get("name", "")),
            kind=str(d.get("kind", "")),
            state=str(d.get("state", "")),
            gpus=gpus,
            attempt=int(d.get("attempt") or 0),
            samples_seen=progress.samples_seen,
            total=progress.total,
            samples_per_s=progress.samples_per_s if d.get("state") in ACTIVE_STATES else None,
            retunes=len(retunes) if isinstance(retunes, list) else retune_count,
            message=d.get("message"),
            created_at=float(d.get("created_at") or 0.0),
            started_at=d.get("started_at"),
            ended_at=d.get("ended_at"),
        )

    def _note_event(self, run_id: str, e: dict[str, Any]) -> None:
        with self._lock:
            p = self._progress.setdefault(run_id, _Progress())
            p.since = max(p.since, int(e.get("id") or 0))
            if e.get("type") == "progress":
                p.samples_seen = e.get("samples_seen", p.samples_seen)
                p.total = e.get("total", p.total)
                p.samples_per_s = e.get("samples_per_s", p.samples_per_s)
            elif e.get("type") == "state" and e.get("state") == "retuning":
                p.retunes += 1  # the daemon records each retune as a move to `retuning`

    def _catch_up(self, run_id: str) -> None:
        """Read the events of an active run we have not seen yet (its progress lives there)."""
        while True:
            since = self._progress.get(run_id, _Progress()).since
            page = self.client.events(run_id, since=since, limit=EVENT_PAGE)
            events = page.get("events", [])
            for e in events:
                self._note_event(run_id, e)
            if len(events) < EVENT_PAGE:
                return

    def runs(self) -> list[RunSummary]:
        rows = self.client.runs()
        for r in rows:
            run_id = str(r["id"])
            attempt = int(r.get("attempt") or 0)
            if attempt and self._placed.get(run_id, (0, []))[0] != attempt:
                # The list has no placement: read it once per attempt (it cannot change within one).
                attempts = self.client.attempts(run_id)
                self._placed[run_id] = (attempt, list(attempts[-1].get("gpus") or []) if attempts else [])
            if r.get("state") in ACTIVE_STATES:
                self._catch_up(run_id)
            elif run_id not in self._final_retunes:
                # A run that is not active no longer changes: count its retunes once.
                self._final_retunes[run_id] = len(self.client.retunes(run_id))
        return [self._summary(r) for r in rows]

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        from gpuwarden.client.run_data import ApiRunData
        from gpuwarden.core.doctor.diagnose import diagnose_run

        return doctor_findings(diagnose_run(ApiRunData(self.client), run_id).to_dict())

    def run_detail(self, run_id: str) -> RunDetail:
        d = self.client.run(run_id)
        run_id = str(d["id"])
        self._catch_up(run_id)
        events: list[RunEvent] = []
        since = 0
        while True:
            page = self.client.events(run_id, since=since, limit=EVENT_PAGE)
            rows = page.get("events", [])
            # Progress events are many and become the charts; the timeline keeps the rest.
            events += [run_event(e, run_id) for e in rows if e.get("type") != "progress"]
            if len(rows) < EVENT_PAGE:
                break
            since = int(page.get("next_since", since))
        metrics = [
            RunMetric(
                ts=float(m["ts"]),
                attempt=int(m.get("attempt") or 0),
                step=m.get("step"),
                loss=m.get("loss"),
                samples_per_s=m.get("samples_per_s"),
                mem_peak=m.get("mem_peak"),
            )
            for m in self.client.metrics(run_id)
        ]
        attempts = [
            AttemptInfo(
                attempt=int(a["attempt"]),
                state=str(a.get("state", "")),
                started_at=a.get("started_at"),
                ended_at=a.get("ended_at"),
                exit_code=a.get("exit_code"),
                classification=a.get("classification"),
                reason=a.get("reason"),
                gpus=tuple(i for i in (self._index(u) for u in a.get("gpus") or []) if i is not None),
            )
            for a in d.get("attempts", [])
        ]
        retunes = [
            RetuneInfo(
                attempt=int(r.get("attempt") or 0),
                ts=float(r.get("ts") or 0.0),
                before=dict(r.get("from") or {}),
                after=dict(r.get("to") or {}),
                verdict=r.get("verdict"),
                evidence=dict(r.get("evidence") or {}),
                outcome=r.get("outcome"),
            )
            for r in d.get("retunes", [])
        ]
        used = [u for a in d.get("attempts", [])[-1:] for u in a.get("gpus") or []]
        capacities = [self._statics[u].memory_total for u in used if u in self._statics]
        capacity = min((c for c in capacities if c), default=None)
        return RunDetail(
            self._summary(d), dict(d.get("spec") or {}), attempts, retunes, events, metrics, capacity
        )

    def logs(self, run_id: str, offset: int, stream: str = "stdout") -> LogChunk:
        chunk = self.client.logs(run_id, stream=stream, offset=offset)
        return LogChunk(
            str(chunk.get("data", "")), int(chunk.get("next_offset", 0)), bool(chunk.get("overflow"))
        )

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        ticks = 0
        stream = self.client.stream()
        try:
            for frame in stream:
                if stop.is_set():
                    return
                data = frame.data
                if frame.event == "sample":
                    ticks += 1
                    snapshot = Snapshot(
                        float(data.get("ts") or 0.0),
                        [gpu_sample(g) for g in data.get("gpus", [])],
                        host_sample(data.get("host")),
                        self._processes() if ticks % PROCESS_EVERY == 0 else None,
                    )
                    yield SampleFrame(snapshot)
                elif frame.event == "run":
                    yield RunFrame(self._summary(data))
                elif frame.event == "event":
                    run_id = str(data.get("run_id", ""))
                    self._note_event(run_id, data)
                    if data.get("type") == "progress":
                        continue  # folded into the run's progress; the runs poll shows it
                    yield EventFrame(run_event(data, run_id))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    # -- controls ----------------------------------------------------------------------------

    def stop_run(self, run_id: str) -> None:
        self.client.stop(run_id)

    def resume_run(self, run_id: str) -> None:
        self.client.resume(run_id)

    def submit(self, spec_path: str) -> str:
        path = Path(spec_path).expanduser()
        text = read_yaml_text(path)
        return str(self.client.submit_yaml(text, path.parent, str(path))["id"])

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        """Edit the run (dotted keys such as `train.batch_size` change the spec itself, plain
        names the command run's `knobs`), then start it again. An active run must be stopped
        first; the edit lands before the resume, so the next attempt always has it."""
        run = self.client.run(run_id)
        state = run.get("state")
        if state in ACTIVE_STATES:
            raise UserError(f"run {run.get('name')} is {state}: stop it first (s), then change it")
        dotted = {k: v for k, v in changes.items() if "." in k}
        plain = {k: v for k, v in changes.items() if "." not in k}
        edit: dict[str, Any] = {}
        if dotted:
            edit["set"] = dotted
        if plain:
            edit["knobs"] = {**dict((run.get("spec") or {}).get("knobs") or {}), **plain}
        self.client.edit(run_id, **edit)
        if state != "queued":
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
