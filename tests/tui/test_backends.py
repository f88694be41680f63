"""The dashboard's adapters: a read-only database, and the daemon's API answers."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GpuProcess, HostSample, Tick
from gpuwarden.tui.api_backend import ApiBackend, series_from_buckets
from gpuwarden.tui.backend import EventFrame, RunFrame, SampleFrame
from gpuwarden.tui.db_backend import DbBackend
from gpuwarden.tui.fake_backend import FROZEN_TS, FakeBackend

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
        fake.clock = lambda ts=ts: ts
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
    assert 55 <= len(points) <= 60 and sum(v is not None for _, v in points) >= 55
    host = backend.host_history(["cpu_percent"], FROZEN_TS - 120, FROZEN_TS, 60)
    assert 12.0 in [v for _, v in host["cpu_percent"]]
    (run,) = backend.runs()
    assert (run.state, run.samples_seen, run.total, run.retunes, run.gpus) == ("running", 40, 160, 1, (0,))
    detail = backend.run_detail("r1")
    assert detail.retunes[0].before == {"batch_size": 8} and detail.retunes[0].verdict == "gpu_capacity"
    assert detail.metrics[0].loss == 1.5 and detail.mem_capacity == 24 * GIB
    assert {e.type for e in detail.events} == {"state"}  # progress events became the charts
    tail = backend.logs("r1", -64)
    assert tail.text.endswith("line 999\n") and tail.truncated
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
    fake.clock = lambda: FROZEN_TS + 1

    def daemon_writes() -> None:
        time.sleep(0.2)  # after frames() has read where the file ends
        writer = open_db(db_file)
        TelemetryStore(writer).write_tick(Tick(FROZEN_TS + 1, fake.snapshot().gpus))
        writer.conn.close()

    thread = threading.Thread(target=daemon_writes)
    thread.start()
    stop = threading.Event()
    frame = next(iter(backend.frames(stop)))
    stop.set()
    thread.join()
    assert isinstance(frame, SampleFrame) and frame.snapshot.ts == FROZEN_TS + 1
    backend.close()


def test_db_backend_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no gpuwarden database"):
        DbBackend(tmp_path / "nope.db")


def test_history_buckets_become_evenly_spaced_points_with_gaps() -> None:
    points = series_from_buckets([[100.0, 5.0, 4.0, 6.0], [130.0, 7.0, 7.0, 7.0]], 100.0, 10.0, 4)
    assert points == [(105.0, 5.0), (115.0, None), (125.0, None), (135.0, 7.0)]


class StubClient:
    """Answers shaped like the daemon's API (see gpuwarden/daemon/api.py), and records calls."""

    socket_path = Path("/run/user/1000/gpuwarden/api.sock")

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        fake = FakeBackend()
        self.statics = fake.gpus()
        self.snapshot = fake.snapshot()

    def health(self) -> dict[str, Any]:
        return {"version": "0.1.0", "socket": str(self.socket_path), "gpu_status": "2 GPUs: …"}

    def gpus(self) -> dict[str, Any]:
        return {
            "ts": FROZEN_TS,
            "gpus": [
                {**g.to_dict(), "first_seen": 0, "sample": s.to_dict()}
                for g, s in zip(self.statics, self.snapshot.gpus, strict=True)
            ],
        }

    def host(self) -> dict[str, Any]:
        return {"host": {"ts": FROZEN_TS, "cpu_percent": 3.0}}

    def processes(self) -> list[dict[str, Any]]:
        import getpass

        return [
            {"pid": 7, "uuid": self.statics[1].uuid, "user": getpass.getuser(), "cmdline": "python x.py",
             "used_memory": GIB, "run_id": None},
            {"pid": 8, "uuid": self.statics[1].uuid, "user": "someone-else", "name": "ollama", "run_id": None},
        ]  # fmt: skip

    def history(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("history", kw))
        if kw.get("host"):
            return {"step": 60.0, "start": FROZEN_TS - 600, "end": FROZEN_TS,
                    "series": {"host": {"cpu_percent": [[FROZEN_TS - 600, 30.0, 20.0, 40.0]]}}}  # fmt: skip
        return {"step": 60.0, "start": FROZEN_TS - 600, "end": FROZEN_TS,
                "series": {self.statics[0].uuid: {"util_gpu": [[FROZEN_TS - 600, 50.0, 40.0, 60.0]]}}}  # fmt: skip

    def runs(self) -> list[dict[str, Any]]:
        return [
            {"id": "r1", "name": "a", "kind": "train", "state": "running", "attempt": 2, "message": None,
             "created_at": 1.0, "started_at": 2.0, "ended_at": None, "gpus": 1},
            {"id": "r2", "name": "b", "kind": "infer", "state": "failed", "attempt": 1, "message": "x",
             "created_at": 0.5, "started_at": 1.0, "ended_at": 3.0, "gpus": 1},
        ]  # fmt: skip

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> dict[str, Any]:
        rows = [
            {"id": 1, "type": "state", "state": "retuning", "ts": 1.0, "source": "daemon"},
            {"id": 2, "type": "progress", "ts": 2.0, "samples_seen": 30, "total": 120, "samples_per_s": 3.0},
            {"id": 3, "type": "oom", "ts": 2.5, "verdict": "gpu_capacity", "phase": "backward"},
        ]
        rows = [r for r in rows if r["id"] > since]
        return {"events": rows, "next_since": rows[-1]["id"] if rows else since, "state": "running"}

    def attempts(self, ref: str) -> list[dict[str, Any]]:
        return [{"attempt": 1, "gpus": [self.statics[1].uuid]}]

    def retunes(self, ref: str) -> list[dict[str, Any]]:
        return [{"attempt": 1}] * 2

    def run(self, ref: str) -> dict[str, Any]:
        base = next((r for r in self.runs() if r["id"] == ref), self.runs()[0])
        run = {**base, "spec": {"name": "a", "knobs": {"bs": 8}}}
        run["attempts"] = [
            {"attempt": 1, "state": "ended", "gpus": [self.statics[0].uuid], "classification": "oom"}
        ]
        run["retunes"] = [{"attempt": 1, "ts": 3.0, "from": {"bs": 8}, "to": {"bs": 4}, "verdict": "gpu_capacity",
                           "evidence": {"free_gib": 0.2}, "outcome": None}]  # fmt: skip
        return run

    def metrics(self, ref: str) -> list[dict[str, Any]]:
        return [{"ts": 2.0, "attempt": 1, "step": 1, "loss": 2.0, "samples_per_s": 3.0, "mem_peak": GIB}]

    def logs(self, ref: str, **kw: Any) -> dict[str, Any]:
        self.calls.append(("logs", kw))
        return {"data": "hello\n", "next_offset": 106, "overflow": True}

    def stream(self) -> Any:
        from gpuwarden.client import StreamFrame

        yield StreamFrame(
            "sample", {"ts": FROZEN_TS, "gpus": [s.to_dict() for s in self.snapshot.gpus], "host": None}
        )
        yield StreamFrame(
            "event", {"run_id": "r1", "id": 4, "type": "progress", "samples_seen": 60, "total": 120}
        )
        yield StreamFrame("run", {**self.runs()[0], "state": "stopped"})
        yield StreamFrame("event", {"run_id": "r1", "id": 5, "type": "state", "state": "stopped", "ts": 9.0})

    def stop(self, ref: str) -> dict[str, Any]:
        self.calls.append(("stop", ref))
        return {}

    def edit(self, ref: str, **changes: Any) -> dict[str, Any]:
        self.calls.append(("edit", ref, changes))
        return {}

    def resume(self, ref: str) -> dict[str, Any]:
        self.calls.append(("resume", ref))
        return {}

    def tune(self, ref: str) -> dict[str, Any]:
        self.calls.append(("tune", ref))
        return {}

    def terminate_process(self, pid: int, grace_seconds: float | None = None) -> dict[str, Any]:
        self.calls.append(("terminate", pid))
        return {"pid": pid}

    def close(self) -> None:
        self.calls.append(("close",))


def test_api_backend_maps_the_api_answers() -> None:
    client = StubClient()
    backend = ApiBackend(client)  # type: ignore[arg-type]
    assert backend.status().sampling is None
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
    assert runs["r1"].gpus == (1,)  # placement read from the run's latest attempt
    detail = backend.run_detail("r1")
    assert detail.attempts[0].gpus == (0,) and detail.mem_capacity == 24 * GIB
    assert detail.retunes[0].after == {"bs": 4} and detail.retunes[0].evidence == {"free_gib": 0.2}
    assert [e.type for e in detail.events] == ["state", "oom"]
    assert "gpu_capacity" in detail.events[1].text
    series = backend.history([client.statics[0].uuid], ["util_gpu"], FROZEN_TS - 600, FROZEN_TS, 10)
    assert series[client.statics[0].uuid]["util_gpu"][0][1] == 50.0
    assert client.calls[-1][1]["window"] == "600s" and client.calls[-1][1]["end"] == FROZEN_TS
    host = backend.host_history(["cpu_percent"], FROZEN_TS - 600, FROZEN_TS, 10)
    assert host["cpu_percent"][0][1] == 30.0 and client.calls[-1][1]["host"] is True
    chunk = backend.logs("r1", -100)
    assert (chunk.text, chunk.offset, chunk.truncated) == ("hello\n", 106, True)


def test_api_backend_stream_frames() -> None:
    backend = ApiBackend(StubClient())  # type: ignore[arg-type]
    backend.gpus()
    frames = list(backend.frames(threading.Event()))
    assert [type(f) for f in frames] == [SampleFrame, RunFrame, EventFrame]
    run_frame = frames[1]
    assert isinstance(run_frame, RunFrame)
    assert run_frame.run.state == "stopped" and run_frame.run.samples_seen == 60


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
    assert edits[0][2]["knobs"] == {"bs": 8, "x": 1} and edits[1] == ("resume", "r2")
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
