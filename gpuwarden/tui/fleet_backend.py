"""`DashboardBackend` over several hosts' daemons (`gpuwarden tui --host A --host B`).

Each host is read through its own `ApiBackend` on the client its `HostLink` keeps (the local
socket, or an ssh tunnel opened again after it broke). Every host is asked on its own thread and
waited for a bounded time, so a host that is down, slow or still connecting costs its own line
(`hosts()`), never the others' data. A GPU is named `HOST/UUID` and numbered across the hosts in
their order (the cards read `[2] gpu2 NVIDIA A100…`); a run keeps its id and carries its host,
and its screen and controls go to the host that owns it. Each host's live stream is followed on
a thread of its own and merged, each frame carrying every host's latest reading.
"""

from __future__ import annotations

import dataclasses
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpuwarden.client import ApiClient
from gpuwarden.client.fleet_view import FleetGpu, read_gpus
from gpuwarden.client.hosts import Fleet, HostAnswer
from gpuwarden.core.api import LogChunk
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic
from gpuwarden.tui.api_backend import ApiBackend
from gpuwarden.tui.backend import (
    DoctorFinding,
    EventFrame,
    Frame,
    HistorySeries,
    HostSeries,
    HostTop,
    ProcessInfo,
    RunDetailView,
    RunFrame,
    RunRow,
    SampleFrame,
    Snapshot,
    SourceStatus,
)

T = TypeVar("T")
WAIT_S = 2.0  # how long one refresh waits for the hosts; a slower one shows "no answer yet"
STREAM_RETRY_S = 3.0
_PATHS = re.compile(r"(/[^\s:'\"`,;()]+)")  # absolute paths in a daemon's one-line refusal
ONE_HOST_ONLY = "with several hosts, {what} goes through one host's dashboard: `gpuwarden tui --host {host}`"


def only_here(refusal: str, host: str) -> str:
    """A host's refusal of a spec, and which of the paths it names exist on this machine only:
    the file was written here, and the host reads its own file system."""
    here = [word for word in _PATHS.findall(refusal) if Path(word).exists()]
    if not here:
        return refusal
    return (
        f"{refusal} — {here[0]} exists on this machine, not on {host}: copy it there (or keep "
        "the project on a file system both see), or submit it on this machine"
    )


def _on_host(top: HostTop, host: str) -> HostTop:
    return HostTop([dataclasses.replace(p, host=host) for p in top.processes], top.unavailable)


class FleetBackend:
    """The dashboard's data from every host of `fleet`; closing it ends the fleet's ssh processes."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.host_names = fleet.names
        self._backends: dict[str, tuple[ApiClient, ApiBackend]] = {}
        self._lock = threading.Lock()
        self._index: dict[tuple[str, int], int] = {}  # (host, its GPU index) → the dashboard's
        self._run_host: dict[str, str] = {}
        self.down: dict[str, str] = {}  # host → the line saying why it shows nothing
        self._latest: dict[str, Snapshot] = {}
        self._procs: dict[str, list[ProcessInfo]] = {}
        self._tops: dict[str, HostTop] = {}

    # -- the hosts -----------------------------------------------------------------------------

    def _backend(self, host: str, client: ApiClient) -> ApiBackend:
        """The ApiBackend on `client` (a new one when the host's link was opened again)."""
        with self._lock:
            known = self._backends.get(host)
            if known is not None and known[0] is client:
                return known[1]
        backend = ApiBackend(client)
        backend.gpus()  # its runs' rows name their GPUs by these
        with self._lock:
            self._backends[host] = (client, backend)
        return backend

    def _each(self, fn: Callable[[str, ApiBackend], T]) -> list[HostAnswer[T]]:
        answers = self.fleet.each_named(lambda host, client: fn(host, self._backend(host, client)), WAIT_S)
        for answer in answers:
            if answer.ok:
                self.down.pop(answer.host, None)
            elif answer.error:
                self.down[answer.host] = answer.error
        return answers

    def _on(self, host: str, fn: Callable[[ApiBackend], T]) -> T:
        link = next(link for link in self.fleet.links if link.name == host)
        return link.call(lambda client: fn(self._backend(host, client)))

    def _owner(self, run_id: str) -> str:
        host = self._run_host.get(run_id)
        if host is None:
            raise UserError(f"run {run_id} is on no host that answers now — it may be on one that is down")
        return host

    def hosts(self) -> list[str]:
        """One line per host that shows nothing now, saying why."""
        return [f"host {host}: {self.down[host]}" for host in self.host_names if host in self.down]

    def gpu_rows(self) -> list[HostAnswer[list[FleetGpu]]]:
        """Every host's GPUs as the hosts tab lists them (or why a host has none to show)."""
        return self._each(lambda host, backend: read_gpus(host, backend.client))

    # -- telemetry -------------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        answers = self._each(lambda _host, backend: backend.status())
        up = [a.value for a in answers if a.value is not None]
        faults = [f"{a.host}: {a.value.storage_fault}" for a in answers if a.value and a.value.storage_fault]
        return SourceStatus(
            "hosts",
            ", ".join(self.host_names),
            host=f"{len(up)} of {len(answers)} hosts",
            sampling=None if self._index or not up else "no GPU on the hosts that answer",
            version=up[0].version if up else None,
            storage_fault="; ".join(faults) or None,
        )

    def storage_fault(self) -> str | None:
        faults = self._each(lambda _host, backend: backend.storage_fault())
        return "; ".join(f"{a.host}: {a.value}" for a in faults if a.value) or None

    def gpus(self) -> list[GpuStatic]:
        statics: list[GpuStatic] = []
        index: dict[tuple[str, int], int] = {}
        for answer in self._each(lambda _host, backend: backend.gpus()):
            for gpu in answer.value or []:
                index[(answer.host, gpu.index)] = len(statics)
                name = f"{answer.host} {gpu.name}"
                statics.append(
                    dataclasses.replace(gpu, uuid=f"{answer.host}/{gpu.uuid}", index=len(statics), name=name)
                )
        self._index = index
        return statics

    def _sample(self, host: str, sample: GpuSample) -> GpuSample:
        return dataclasses.replace(sample, uuid=f"{host}/{sample.uuid}")

    def _process(self, host: str, proc: ProcessInfo) -> ProcessInfo:
        local = proc.gpu_index
        return dataclasses.replace(
            proc,
            uuid=f"{host}/{proc.uuid}",
            gpu_index=None if local is None else self._index.get((host, local)),
        )

    def _host_snapshot(self, host: str, snap: Snapshot) -> Snapshot:
        """`snap` in the dashboard's GPU names, kept as the host's latest reading."""
        named = Snapshot(
            snap.ts,
            [self._sample(host, s) for s in snap.gpus],
            snap.host,
            None if snap.processes is None else [self._process(host, p) for p in snap.processes],
            None if snap.top is None else _on_host(snap.top, host),
        )
        with self._lock:
            self._latest[host] = named
            if named.processes is not None:
                self._procs[host] = named.processes
            if named.top is not None:
                self._tops[host] = named.top
        return named

    def _merged_top(self) -> HostTop:
        """Every host's heaviest processes in one list, busiest first, each naming its host."""
        with self._lock:
            tops = [(h, self._tops[h]) for h in self.host_names if h in self._tops]
        rows = sorted(
            (p for _, top in tops for p in top.processes),
            key=lambda p: (p.cpu_percent if p.cpu_percent is not None else -1.0, p.rss or 0),
            reverse=True,
        )
        missing = "; ".join(f"{h}: {top.unavailable}" for h, top in tops if top.unavailable)
        return HostTop(rows, None if rows else missing or None)

    def _merged(self, processes: bool) -> Snapshot:
        """Every host's latest reading as one snapshot (the host panel shows the first host's)."""
        with self._lock:
            latest = [self._latest[h] for h in self.host_names if h in self._latest]
            procs = [p for h in self.host_names for p in self._procs.get(h, [])]
        return Snapshot(
            max((s.ts for s in latest), default=time.time()),
            [g for s in latest for g in s.gpus],
            latest[0].host if len(latest) == 1 else None,
            procs if processes else None,
            self._merged_top() if processes else None,
        )

    def snapshot(self) -> Snapshot:
        for answer in self._each(lambda _host, backend: backend.snapshot()):
            if answer.value is not None:
                self._host_snapshot(answer.host, answer.value)
        return self._merged(processes=True)

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        def read(host: str, backend: ApiBackend) -> HistorySeries:
            mine = [g.split("/", 1)[1] for g in gpus if g.startswith(f"{host}/")]
            return backend.history(mine, metrics, start, end, points) if mine else {}

        series: HistorySeries = {}
        for answer in self._each(read):
            series.update({f"{answer.host}/{uuid}": v for uuid, v in (answer.value or {}).items()})
        return series

    def host_history(self, metrics: Sequence[str], start: float, end: float, points: int) -> HostSeries:
        """The host charts are one machine's: with several hosts, none (the GPU charts cover them)."""
        if len(self.host_names) != 1:
            return {}
        return self._on(self.host_names[0], lambda b: b.host_history(metrics, start, end, points))

    # -- runs ------------------------------------------------------------------------------------

    def _row(self, host: str, row: RunRow) -> RunRow:
        placed = tuple(self._index.get((host, i), i) for i in row.placed)
        return row.model_copy(update={"host": host, "placed": placed})

    def runs(self) -> list[RunRow]:
        rows: list[RunRow] = []
        for answer in self._each(lambda _host, backend: backend.runs()):
            for row in answer.value or []:
                self._run_host.setdefault(row.id, answer.host)
                rows.append(self._row(answer.host, row))
        return rows

    def run_detail(self, run_id: str) -> RunDetailView:
        host = self._owner(run_id)
        view = self._on(host, lambda b: b.run_detail(run_id))
        return dataclasses.replace(view, run=self._row(host, view.run))

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        return self._on(self._owner(run_id), lambda b: b.doctor(run_id))

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        return self._on(self._owner(run_id), lambda b: b.logs(run_id, offset, stream, attempt))

    # -- the live streams ------------------------------------------------------------------------

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        """Every host's frames, each host's stream followed (and followed again after it broke)
        on a thread of its own, so one host's silence never holds the others'."""
        merged: queue.Queue[Frame] = queue.Queue()
        for host in self.host_names:
            threading.Thread(
                target=self._follow, args=(host, stop, merged), name=f"stream-{host}", daemon=True
            ).start()
        while not stop.is_set():
            try:
                yield merged.get(timeout=0.25)
            except queue.Empty:
                continue

    def _follow(self, host: str, stop: threading.Event, out: queue.Queue[Frame]) -> None:
        while not stop.is_set():
            try:
                self._on(host, lambda b: self._pump(host, b, stop, out))
            except UserError as exc:
                self.down[host] = exc.message
            stop.wait(STREAM_RETRY_S)

    def _pump(self, host: str, backend: ApiBackend, stop: threading.Event, out: queue.Queue[Frame]) -> None:
        self.down.pop(host, None)
        for frame in backend.frames(stop):
            if isinstance(frame, SampleFrame):
                self._host_snapshot(host, frame.snapshot)
                out.put(SampleFrame(self._merged(processes=frame.snapshot.processes is not None)))
            elif isinstance(frame, RunFrame):
                self._run_host.setdefault(frame.run.id, host)
                out.put(RunFrame(self._row(host, frame.run)))
            elif isinstance(frame, EventFrame):
                out.put(frame)

    # -- controls --------------------------------------------------------------------------------

    def stop_run(self, run_id: str) -> None:
        self._on(self._owner(run_id), lambda b: b.stop_run(run_id))

    def resume_run(self, run_id: str) -> None:
        self._on(self._owner(run_id), lambda b: b.resume_run(run_id))

    def submit(self, spec_path: str) -> str:
        if len(self.host_names) != 1:
            raise UserError(f"with several hosts, say which one: one of {', '.join(self.host_names)}")
        return self.submit_to(self.host_names[0], spec_path)

    def submit_to(self, host: str, spec_path: str) -> str:
        """Submit the spec file here to `host`'s daemon: the spec is sent, and its relative paths
        start from this file's folder as that host sees it (the same path on a shared file
        system). A path the host does not have but this machine does is said so."""
        try:
            run_id = self._on(host, lambda b: b.submit(spec_path))
        except UserError as exc:
            raise UserError(only_here(str(exc), host)) from None
        with self._lock:
            self._run_host[run_id] = host
        return run_id

    def rerun(self, run_id: str, typed: dict[str, Any]) -> str:
        """The new run goes to the host of the run it comes from (its spec's paths are that host's)."""
        host = self._owner(run_id)
        new_id = self._on(host, lambda b: b.rerun(run_id, typed))
        with self._lock:
            self._run_host[new_id] = host
        return new_id

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        self._on(self._owner(run_id), lambda b: b.restart_with(run_id, changes))

    def tune(self, run_id: str) -> None:
        self._on(self._owner(run_id), lambda b: b.tune(run_id))

    def kill_process(self, pid: int) -> None:
        if len(self.host_names) != 1:
            raise UserError(ONE_HOST_ONLY.format(what="terminating a process", host=self.host_names[0]))
        self._on(self.host_names[0], lambda b: b.kill_process(pid))

    def close(self) -> None:
        self.fleet.close()
