"""The dashboard's adapters: a read-only database, and the daemon's API answers."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.api import (
    Attempt,
    EventsPage,
    GpuInfo,
    GpuList,
    Health,
    HistoryAnswer,
    HostProcesses,
    HostReading,
    LiveProcess,
    LogChunk,
    RankedProcess,
    Retune,
    RunDetail,
    RunMetric,
    RunSummary,
)
from gpuwarden.core.api.runs import AttemptRecord
from gpuwarden.core.command.record import write_record
from gpuwarden.core.errors import UserError
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GpuProcess, HostSample, Tick
from gpuwarden.tui.api_backend import ApiBackend, series_from_buckets
from gpuwarden.tui.backend import EventFrame, RunFrame, SampleFrame
from gpuwarden.tui.db_backend import DbBackend
from tests.tui.conftest import clock_at
from tests.tui.fake_backend import FROZEN_TS, FakeBackend

GIB = 1024**3


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    """A database as a daemon leaves it: 2 GPUs, 2 minutes of samples, one run with a retune."""
    path = tmp_path / "gpuwarden.db"
    db = open_db(path)
    telemetry = TelemetryStore(db)
    fake = FakeBackend()
    telemetry.upsert_gpus(fake.gpus(), FROZEN_TS - 120)
    for k in range(120):
        ts = FROZEN_TS - 120 + k
        fake.clock = clock_at(ts)
        snap = fake.snapshot()
        procs = [
            GpuProcess(
                ts, snap.gpus[0].uuid, 4242, 3 * GIB, name="python", cmdline="python train.py", user="me"
            )
        ]
        telemetry.write_tick(Tick(ts, snap.gpus, HostSample(ts, cpu_percent=12.0, mem_total=64 * GIB), procs))
    telemetry.flush()
    runs = RunStore(db)
    runs.create_run("r1", "finetune", "train", {"name": "finetune", "knobs": {}}, str(tmp_path / "r1"))
    runs.add_attempt("r1", 1, stdout_path=str(tmp_path / "out.log"), stderr_path="e", events_path="v",
                     gpus=[snap.gpus[0].uuid])  # fmt: skip
    runs.add_events("r1", 1, [{"type": "progress", "ts": FROZEN_TS, "step": 5, "samples_seen": 40,
                               "total": 160, "samples_per_s": 8.0, "loss": 1.5, "mem_peak": 20 * GIB}], 100)  # fmt: skip
    runs.add_retune("r1", 1, {"batch_size": 8}, {"batch_size": 4}, "gpu_capacity", {"reserved_gib": 23.1})
    runs.set_state("r1", "starting", "attempt 1")
    runs.set_state("r1", "running", "attempt 1")
    (tmp_path / "out.log").write_text("".join(f"line {i}\n" for i in range(1000)))
    handed = AttemptRecord(
        prepared_at=FROZEN_TS, argv=["python", "train.py"], cwd="/w", knobs={"lr": 0.1}, env={}
    )
    write_record(tmp_path / "r1", 1, handed)  # what the daemon wrote in the run's folder
    db.conn.close()
    return path


def test_db_backend_reads_everything_and_writes_nothing(db_file: Path) -> None:
    digest = hashlib.sha256(db_file.read_bytes()).hexdigest()
    backend = DbBackend(db_file, clock=lambda: FROZEN_TS)
    status = backend.status()
    assert status.source == "database" and not status.controls and status.sampling is None
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1]
    snap = backend.snapshot()
    assert len(snap.gpus) == 2 and snap.host is not None and snap.host.cpu_percent == 12.0
    assert snap.processes and snap.processes[0].pid == 4242 and snap.processes[0].gpu_index == 0
    series = backend.history([gpus[0].uuid], ["util_gpu"], FROZEN_TS - 120, FROZEN_TS, 60)
    points = series[gpus[0].uuid]["util_gpu"]
    assert 55 <= len(points) <= 60 and sum(p.value is not None for p in points) >= 55
    host = backend.host_history(["cpu_percent"], FROZEN_TS - 120, FROZEN_TS, 60)
    assert 12.0 in [p.value for p in host["cpu_percent"]]
    (run,) = backend.runs()
    assert (run.state, run.samples_seen, run.total, run.retunes, run.placed) == ("running", 40, 160, 1, (0,))
    detail = backend.run_detail("r1")
    assert detail.retunes[0].before == {"batch_size": 8} and detail.retunes[0].verdict == "gpu_capacity"
    prepared = detail.attempts[0].prepared  # as the API's run detail has it
    assert prepared is not None and prepared.knobs == {"lr": 0.1}
    assert detail.metrics[0].loss == 1.5 and detail.mem_capacity == 24 * GIB
    assert {e.type for e in detail.events} == {"state"}  # progress events became the charts
    tail = backend.logs("r1", -64)
    assert tail.data.endswith("line 999\n") and tail.overflow and tail.attempt == 1 and not tail.eof
    for control in (
        lambda: backend.stop_run("r1"),
        lambda: backend.submit("x.yaml"),
        lambda: backend.kill_process(1),
    ):
        with pytest.raises(UserError, match="read-only"):
            control()
    backend.close()
    assert hashlib.sha256(db_file.read_bytes()).hexdigest() == digest


def test_db_backend_follows_samples_a_daemon_keeps_writing(db_file: Path) -> None:
    backend = DbBackend(db_file)
    backend.poll_s = 0.01
    backend.gpus()
    fake = FakeBackend()
    stop = threading.Event()
    written: list[float] = []

    def daemon_writes() -> None:
        # A tick every 20 ms until the reader has one: whenever frames() reads where the file
        # ends, a later tick follows it (no guess at how long that takes on a loaded machine).
        writer = open_db(db_file)
        while not stop.is_set():
            ts = FROZEN_TS + 1 + len(written)
            fake.clock = clock_at(ts)
            TelemetryStore(writer).write_tick(Tick(ts, fake.snapshot().gpus))
            written.append(ts)
            stop.wait(0.02)
        writer.conn.close()

    thread = threading.Thread(target=daemon_writes)
    thread.start()
    try:
        frame = next(iter(backend.frames(stop)))
    finally:
        stop.set()
        thread.join()
    assert isinstance(frame, SampleFrame) and frame.snapshot.ts in written
    backend.close()


def test_db_backend_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no gpuwarden database"):
        DbBackend(tmp_path / "nope.db")


def test_history_buckets_become_evenly_spaced_points_with_gaps() -> None:
    points = series_from_buckets([[100.0, 5.0, 4.0, 6.0], [130.0, 7.0, 7.0, 7.0]], 100.0, 10.0, 4)
    # Each point is the bucket's mean and its largest reading (the rollups keep both).
    assert points == [(105.0, 5.0, 6.0), (115.0, None, None), (125.0, None, None), (135.0, 7.0, 7.0)]


def _summary(run_id: str, name: str, kind: str, state: str, attempt: int, message: str | None,
             created: float, started: float, ended: float | None) -> dict[str, Any]:  # fmt: skip
    return {"id": run_id, "name": name, "kind": kind, "state": state, "attempt": attempt, "message": message,
            "created_at": created, "updated_at": ended or started, "started_at": started, "ended_at": ended,
            "gpus": 1}  # fmt: skip


def _attempt(run_id: str, gpus: list[str], **kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "run_id": run_id, "attempt": 1, "state": "ended", "pid": 10, "create_time": 1.0, "started_at": 2.0,
        "ended_at": 3.0, "exit_code": 3, "signal": None, "classification": None, "reason": None, "adopted": False,
        "events_offset": 0, "events_skipped": 0, "stdout_path": "o", "stderr_path": "e", "events_path": "v",
        "gpus": gpus, "oom_kill_before": None,
    }  # fmt: skip
    return Attempt.model_validate({**fields, **kw})


def _retune(run_id: str, **kw: Any) -> Retune:
    fields: dict[str, Any] = {"id": 1, "run_id": run_id, "attempt": 1, "ts": 3.0, "verdict": None, "outcome": None,
                              "from": {}, "to": {}, "evidence": None, "prediction": None}  # fmt: skip
    return Retune.model_validate({**fields, **kw})


class StubClient:
    """Answers shaped like the daemon's API (the models of gpuwarden.core.api), and records calls."""

    socket_path = Path("/run/user/1000/gpuwarden/api.sock")

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.old_daemon = False  # one from before the host's process list
        fake = FakeBackend()
        self.statics = fake.gpus()
        self.snapshot = fake.snapshot()

    def health(self) -> Health:
        return Health(name="gpuwarden", version="0.1.0", api_version="1.0", pid=1, uptime_s=1.0,
                      gpu_status="2 GPUs: …", db="/x.db", socket=str(self.socket_path), active_runs=1,
                      stream_clients=0)  # fmt: skip

    def gpus(self) -> GpuList:
        return GpuList(
            status="2 GPUs",
            ts=FROZEN_TS,
            gpus=[GpuInfo.of(g, s) for g, s in zip(self.statics, self.snapshot.gpus, strict=True)],
        )

    def host(self) -> HostReading:
        return HostReading(host=HostSample(ts=FROZEN_TS, cpu_percent=3.0))

    def host_processes(self, top: int = 20) -> HostProcesses:
        import getpass

        self.calls.append(("host_processes", top))
        if self.old_daemon:
            raise UserError("GET /v1/host/processes: not found", code="not_found")
        rows = [
            RankedProcess(pid=7, user=getpass.getuser(), cpu_percent=99.0, rss=GIB, cmdline="python x.py", run_id="r1"),
            RankedProcess(pid=9, user=None, rss=2 * GIB, name="kworker"),
        ]  # fmt: skip
        return HostProcesses(processes=rows, cpu_count=8, ts=FROZEN_TS)

    def processes(self) -> list[LiveProcess]:
        import getpass

        uuid = self.statics[1].uuid
        return [
            LiveProcess(ts=FROZEN_TS, uuid=uuid, pid=7, used_memory=GIB, user=getpass.getuser(), cmdline="python x.py"),
            LiveProcess(ts=FROZEN_TS, uuid=uuid, pid=8, user="someone-else", name="ollama"),
        ]  # fmt: skip

    def history(self, **kw: Any) -> HistoryAnswer:
        self.calls.append(("history", kw))
        key, metric = ("host", "cpu_percent") if kw.get("host") else (self.statics[0].uuid, "util_gpu")
        value = 30.0 if kw.get("host") else 50.0
        return HistoryAnswer(tier="1m", step=60.0, start=FROZEN_TS - 600, end=FROZEN_TS,
                             series={key: {metric: [(FROZEN_TS - 600, value, value - 10, value + 10)]}})  # fmt: skip

    def runs(self) -> list[RunSummary]:
        return [
            RunSummary.model_validate(_summary("r1", "a", "train", "running", 2, None, 1.0, 2.0, None)),
            RunSummary.model_validate(_summary("r2", "b", "infer", "failed", 1, "x", 0.5, 1.0, 3.0)),
        ]

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> EventsPage:
        self.calls.append(("events", ref))
        rows: list[dict[str, Any]] = [
            {"id": 1, "attempt": 1, "type": "state", "state": "retuning", "ts": 1.0, "source": "daemon"},
            {"id": 2, "attempt": 1, "type": "progress", "ts": 2.0, "samples_seen": 30, "total": 120,
             "samples_per_s": 3.0, "source": "runner"},
            {"id": 3, "attempt": 1, "type": "oom", "ts": 2.5, "verdict": "gpu_capacity", "phase": "backward",
             "source": "runner"},
        ]  # fmt: skip
        rows = [r for r in rows if r["id"] > since]
        page = {"events": rows, "next_since": rows[-1]["id"] if rows else since, "state": "running"}
        return EventsPage.model_validate(page)

    def attempts(self, ref: str) -> list[Attempt]:
        return [_attempt(ref, [self.statics[1].uuid])]

    def retunes(self, ref: str) -> list[Retune]:
        return [_retune(ref), _retune(ref, id=2)]

    def run(self, ref: str) -> RunDetail:
        base = next((r for r in self.runs() if r.id == ref), self.runs()[0])
        return RunDetail.model_validate(
            {
                **base.model_dump(),
                "run_dir": "/runs/x", "stop_requested": False, "spec": {"name": "a", "knobs": {"bs": 8}},
                "submitted_spec": {}, "effective_batch": None, "report": None,
                "attempts": [_attempt(base.id, [self.statics[0].uuid], classification="oom")],
                "retunes": [_retune(base.id, **{"from": {"bs": 8}, "to": {"bs": 4}}, verdict="gpu_capacity",
                                    evidence={"free_gib": 0.2})],
            }
        )  # fmt: skip

    def metrics(self, ref: str) -> list[RunMetric]:
        return [RunMetric(run_id=ref, ts=2.0, attempt=1, step=1, loss=2.0, samples_per_s=3.0, mem_peak=GIB)]

    def logs(self, ref: str, **kw: Any) -> LogChunk:
        self.calls.append(("logs", kw))
        return LogChunk(data="hello\n", offset=100, next_offset=106, overflow=True, size=106, eof=False,
                        attempt=2, stream="stdout")  # fmt: skip

    def stream(self) -> Any:
        from gpuwarden.client import StreamFrame

        yield StreamFrame(
            "sample", {"ts": FROZEN_TS, "gpus": [s.to_dict() for s in self.snapshot.gpus], "host": None}
        )
        yield StreamFrame(
            "event",
            {"run_id": "r1", "id": 4, "attempt": 2, "type": "progress", "ts": 8.0, "source": "runner",
             "samples_seen": 60, "total": 120},
        )  # fmt: skip
        yield StreamFrame("run", {**self.runs()[0].model_dump(mode="json"), "state": "stopped", "dropped": 0})
        yield StreamFrame(
            "event",
            {"run_id": "r1", "id": 5, "attempt": 2, "type": "state", "state": "stopped", "ts": 9.0,
             "source": "daemon"},
        )  # fmt: skip

    def stop(self, ref: str) -> None:
        self.calls.append(("stop", ref))

    def edit(self, ref: str, **changes: Any) -> None:
        self.calls.append(("edit", ref, changes))

    def resume(self, ref: str) -> None:
        self.calls.append(("resume", ref))

    def tune(self, ref: str) -> None:
        self.calls.append(("tune", ref))

    def terminate_process(self, pid: int, grace_seconds: float | None = None) -> None:
        self.calls.append(("terminate", pid))

    def close(self) -> None:
        self.calls.append(("close",))


def test_api_backend_maps_the_api_answers() -> None:
    client = StubClient()
    backend = ApiBackend(client)  # type: ignore[arg-type]
    status = backend.status()
    assert status.sampling is None and status.host  # the machine's name for the status line
    snap = backend.snapshot()
    assert len(snap.gpus) == 2 and snap.host is not None and snap.host.cpu_percent == 3.0
    assert snap.processes is not None
    assert [(p.pid, p.gpu_index, p.owned) for p in snap.processes] == [(7, 1, True), (8, 1, False)]
    runs = {r.id: r for r in backend.runs()}
    # The active run's progress comes from its events; the finished one's retunes are counted once.
    assert (runs["r1"].samples_seen, runs["r1"].total, runs["r1"].samples_per_s, runs["r1"].retunes) == (
        30,
        120,
        3.0,
        1,
    )
    assert runs["r2"].retunes == 2 and runs["r2"].samples_per_s is None
    # A finished run shows where it ended in a freshly opened dashboard too (read once).
    assert (runs["r2"].samples_seen, runs["r2"].total) == (30, 120)
    reads = len([c for c in client.calls if c == ("events", "r2")])
    backend.runs()
    assert len([c for c in client.calls if c == ("events", "r2")]) == reads
    assert runs["r1"].placed == (1,) and runs["r1"].pid == 10  # from the run's latest attempt
    assert runs["r2"].pid is None  # a finished run has no process
    detail = backend.run_detail("r1")
    assert detail.gpu_index[detail.attempts[0].gpus[0]] == 0 and detail.mem_capacity == 24 * GIB
    assert detail.retunes[0].after == {"bs": 4} and detail.retunes[0].evidence == {"free_gib": 0.2}
    assert [e.type for e in detail.events] == ["state", "oom"] and detail.oom_phases == {1: "backward"}
    assert "gpu_capacity" in detail.events[1].text
    series = backend.history([client.statics[0].uuid], ["util_gpu"], FROZEN_TS - 600, FROZEN_TS, 10)
    assert series[client.statics[0].uuid]["util_gpu"][0][1] == 50.0
    assert client.calls[-1][1]["window"] == "600s" and client.calls[-1][1]["end"] == FROZEN_TS
    host = backend.host_history(["cpu_percent"], FROZEN_TS - 600, FROZEN_TS, 10)
    assert host["cpu_percent"][0][1] == 30.0 and client.calls[-1][1]["host"] is True
    chunk = backend.logs("r1", -100)
    assert (chunk.data, chunk.next_offset, chunk.overflow) == ("hello\n", 106, True)


def test_api_backend_stream_frames() -> None:
    backend = ApiBackend(StubClient())  # type: ignore[arg-type]
    backend.gpus()
    frames = list(backend.frames(threading.Event()))
    assert [type(f) for f in frames] == [SampleFrame, RunFrame, EventFrame]
    run_frame = frames[1]
    assert isinstance(run_frame, RunFrame)
    assert run_frame.run.state == "stopped" and run_frame.run.samples_seen == 60


def test_api_backend_reads_daemon_notes_and_skips_frames_it_cannot_read() -> None:
    from gpuwarden.client import StreamFrame

    client = StubClient()
    client.stream = lambda: iter(  # type: ignore[method-assign]
        [
            # The daemon's own notes about a run are streamed without a time.
            StreamFrame("event", {"run_id": "r1", "id": 6, "attempt": 2, "type": "stopping", "source": "daemon",
                                  "grace_seconds": 5.0}),
            StreamFrame("run", {"id": "r1", "state": "no-such-state"}),
            StreamFrame("sample", {"ts": "soon"}),
        ]
    )  # fmt: skip
    backend = ApiBackend(client)  # type: ignore[arg-type]
    before = time.time()
    frames = list(backend.frames(threading.Event()))
    assert len(frames) == 1 and isinstance(frames[0], EventFrame)
    assert frames[0].event.type == "stopping" and frames[0].event.ts >= before


def test_api_backend_controls() -> None:
    client = StubClient()
    backend = ApiBackend(client)  # type: ignore[arg-type]
    backend.stop_run("r1")
    assert ("stop", "r1") in client.calls
    with pytest.raises(UserError, match="stop it first"):
        backend.restart_with("r1", {"bs": 2})  # r1 is running
    client.calls.clear()
    backend.restart_with("r2", {"train.batch_size": 2, "x": 1})  # r2 failed: edit first, then resume
    edits = [c for c in client.calls if c[0] in ("edit", "resume")]
    assert edits[0][0] == "edit" and edits[0][2]["set"] == {"train.batch_size": 2}
    assert edits[0][2]["knobs"] == {"x": 1} and edits[1] == ("resume", "r2")
    backend.tune("r1")
    assert ("tune", "r1") in client.calls
    # the daemon decides what may be terminated (its own checks are tested in tests/daemon)
    backend.kill_process(8)
    assert ("terminate", 8) in client.calls


def test_the_app_browses_a_database_read_only(db_file: Path) -> None:
    from textual.widgets import DataTable

    from gpuwarden.tui.widgets.gpu_card import GpuCard
    from tests.tui.conftest import make_app, run, settle

    async def body() -> None:
        app = make_app(DbBackend(db_file, clock=lambda: FROZEN_TS))
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.readonly  # the source cannot act, so no control is offered
            assert len(list(app.query(GpuCard))) == 2
            assert app.query_one("#runs-table", DataTable).row_count == 1

    run(body())


def test_a_database_refuses_to_run_a_run_again_in_one_line(db_file: Path) -> None:
    with pytest.raises(UserError) as caught:
        DbBackend(db_file).rerun("r1", {"batch_size": 2})
    assert "\n" not in caught.value.message and "read-only" in caught.value.message


def test_api_backend_reads_the_hosts_heaviest_processes_and_tells_an_old_daemon() -> None:
    client = StubClient()
    backend = ApiBackend(client)  # type: ignore[arg-type]
    top = backend.snapshot().top
    assert top is not None and top.unavailable is None
    mine, other = top.processes
    assert (mine.pid, mine.run_id, mine.owned, mine.command, mine.cpu_percent) == (
        7,
        "r1",
        True,
        "python x.py",
        99.0,
    )
    assert (other.user, other.owned, other.command, other.cpu_percent) == (None, False, "kworker", None)
    assert ("host_processes", 20) in client.calls
    client.old_daemon = True
    old = backend.snapshot().top
    assert old is not None and not old.processes
    assert old.unavailable and "gpuwarden down && gpuwarden up" in old.unavailable


def test_db_backend_reads_a_scripts_progress_bar_and_prefers_what_a_run_reports(tmp_path: Path) -> None:
    db = open_db(tmp_path / "gpuwarden.db")
    runs = RunStore(db)
    for run_id in ("rbar", "rown"):
        runs.create_run(run_id, run_id, "command", {"name": run_id, "knobs": {}}, str(tmp_path / run_id))
        runs.add_attempt(run_id, 1, stdout_path="o", stderr_path="e", events_path="v", gpus=[])
        runs.set_state(run_id, "starting", "attempt 1")
        runs.set_state(run_id, "running", "attempt 1")
        drawn = {"desc": "train", "n": 12, "bar_total": 40, "unit": "it", "rate": 4.0, "remaining_s": 7}
        runs.add_daemon_event(run_id, 1, "progress_bar", drawn)
    runs.add_events("rown", 1, [{"type": "progress", "ts": FROZEN_TS, "step": 3, "samples_seen": 24,
                                 "total": 160, "samples_per_s": 8.0}], 100)  # fmt: skip
    runs.add_daemon_event("rown", 1, "progress_bar", {"desc": "", "n": 99, "bar_total": 100})
    db.conn.close()
    backend = DbBackend(tmp_path / "gpuwarden.db")
    try:
        rows = {r.id: r for r in backend.runs()}
    finally:
        backend.close()
    assert (rows["rbar"].samples_seen, rows["rbar"].total, rows["rbar"].samples_per_s) == (12, 40, 4.0)
    assert (rows["rown"].samples_seen, rows["rown"].total, rows["rown"].samples_per_s) == (24, 160, 8.0)
