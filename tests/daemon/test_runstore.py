"""The run tables: migration, atomic events + offset, resolving references, cascading deletes."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.attempt_energy import EnergyReading, add_readings
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.submission import Submission, SubmittedRun
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.process import ExitStatus, classify


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(open_db(tmp_path / "t.db"))


def _run(store: RunStore, run_id: str, name: str) -> None:
    store.create_run(run_id, name, "command", {"name": name}, f"/runs/{run_id}")


def test_events_and_their_offset_commit_together(store: RunStore) -> None:
    _run(store, "r1", "a")
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="ev", gpus=["GPU-1"])
    ids = store.add_events(
        "r1",
        1,
        [{"type": "progress", "ts": 1.0, "step": 3, "samples_seen": 24, "loss": 0.25}],
        120,
        skipped=1,
    )
    attempt = store.attempt("r1", 1)
    assert attempt is not None and attempt["events_offset"] == 120 and attempt["events_skipped"] == 1
    assert attempt["gpus"] == ["GPU-1"]
    assert [e["id"] for e in store.events("r1", types=["progress"])] == ids
    assert store.metrics("r1")[0]["loss"] == 0.25
    with pytest.raises(ValueError, match="could not convert"):  # any failure must roll back both
        store.add_events("r1", 1, [{"type": "progress", "ts": "not a number"}], 999)
    again = store.attempt("r1", 1)
    assert again is not None and again["events_offset"] == 120
    assert len(store.events("r1", types=["progress"])) == 1


def test_state_changes_are_events_and_runs_resolve_by_id_name_or_prefix(store: RunStore) -> None:
    _run(store, "rabc111", "train-small")
    _run(store, "rabc222", "train-big")
    event = store.set_state("rabc111", "failed", "exit code 1")
    assert event["state"] == "failed" and event["id"] > 0
    run = store.get_run("rabc111")
    assert run is not None and run["ended_at"] is not None
    assert store.resolve("rabc111")["id"] == "rabc111"
    assert store.resolve("train-big")["id"] == "rabc222"
    assert store.resolve("train-s")["id"] == "rabc111"
    with pytest.raises(UserError) as ambiguous:
        store.resolve("rabc")
    assert ambiguous.value.code == "ambiguous"
    with pytest.raises(UserError) as missing:
        store.resolve("zzz")
    assert missing.value.code == "not_found"
    with pytest.raises(UserError):
        store.resolve("%")  # LIKE wildcards are literal


def test_every_time_the_store_stamps_comes_from_its_clock(tmp_path: Path) -> None:
    ticks = iter(range(100, 1000, 10))
    store = RunStore(open_db(tmp_path / "t.db"), clock=lambda: float(next(ticks)))
    _run(store, "r1", "a")  # 100
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="ev", gpus=[])  # 110
    store.update_run("r1", message="loading")  # 120
    store.add_daemon_event("r1", 1, "warning", {"message": "slow disk"})  # 130
    store.add_retune("r1", 1, {"bs": 8}, {"bs": 4}, spec={"name": "a"})  # 140
    store.set_state("r1", "running")  # 150
    store.set_state("r1", "succeeded")  # 160
    run = store.get_run("r1")
    assert run is not None
    assert [run[k] for k in ("created_at", "started_at", "updated_at", "ended_at")] == [100, 110, 160, 160]
    attempt = store.attempt("r1", 1)
    assert attempt is not None and attempt["started_at"] == 110
    assert [e["ts"] for e in store.events("r1")] == [100, 110, 130, 150, 160]
    assert [r["ts"] for r in store.retunes("r1")] == [140]


def test_a_full_database_refuses_a_write_with_its_own_error_and_takes_the_next(store: RunStore) -> None:
    _run(store, "r1", "a")
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count = {pages}")  # not one page more
    with pytest.raises(sqlite3.OperationalError) as full:
        store.add_daemon_event("r1", 0, "warning", {"message": "x" * 50_000})
    assert full.value.sqlite_errorcode == sqlite3.SQLITE_FULL  # what tells a full disk from a bug
    assert not store.conn.in_transaction
    store.conn.execute(f"PRAGMA max_page_count = {pages * 1000}")
    store.add_daemon_event("r1", 0, "warning", {"message": "room again"})
    assert [e["message"] for e in store.events("r1", types=["warning"])] == ["room again"]


def test_delete_removes_everything_of_a_run(store: RunStore) -> None:
    _run(store, "r1", "a")
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="ev", gpus=[])
    store.add_events("r1", 1, [{"type": "progress", "ts": 1.0, "step": 1}], 10)
    store.add_retune("r1", 1, {"batch_size": 8}, {"batch_size": 4}, verdict="gpu_capacity")
    store.set_retune_outcome("r1", "succeeded")
    assert store.retunes("r1")[0]["outcome"] == "succeeded"
    assert store.retunes("r1")[0]["from"] == {"batch_size": 8}
    store.delete_run("r1")
    for table in ("runs", "attempts", "run_events", "retunes", "run_metrics"):
        assert store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0


def test_events_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')
    tail = EventsTail(path)
    chunk = tail.read()
    assert chunk is not None and chunk.lines == ['{"a":1}'] and chunk.end_offset == 8
    tail.commit(chunk.end_offset)
    assert tail.read() is None  # the half line waits
    with path.open("ab") as fh:
        fh.write(b"2}\n")
    chunk = tail.read()
    assert chunk is not None and chunk.lines == ['{"b":2}']
    tail.commit(chunk.end_offset)
    with path.open("ab") as fh:
        fh.write(b'{"c":3}')
    final = tail.read(final=True)  # the writer is gone: take the unterminated line too
    assert final is not None and final.lines == ['{"c":3}'] and final.end_offset == path.stat().st_size


@pytest.mark.parametrize(
    ("status", "stop", "oom_delta", "event", "outcome"),
    [
        (ExitStatus(0, None), False, 0, None, "succeeded"),
        (ExitStatus(1, None), False, 0, None, "failed"),
        (ExitStatus(3, None), False, 0, None, "oom"),
        (ExitStatus(1, None), False, 0, "oom", "oom"),
        (ExitStatus(None, signal.SIGKILL), False, 1, None, "oom"),
        (ExitStatus(None, signal.SIGKILL), False, 0, None, "failed"),
        (ExitStatus(None, signal.SIGKILL), True, 1, None, "stopped"),
        (ExitStatus(143, None), False, None, None, "terminated"),
        (ExitStatus(None, None), False, None, "finished", "succeeded"),
        (ExitStatus(None, None), False, None, "error", "failed"),
        (ExitStatus(None, None), False, None, None, "failed"),
    ],
)
def test_exit_classification(
    status: ExitStatus, stop: bool, oom_delta: int | None, event: str | None, outcome: str
) -> None:
    verdict = classify(status, stop_requested=stop, oom_kills_delta=oom_delta, last_runner_event=event)
    assert verdict.outcome == outcome
    assert verdict.reason and "\n" not in verdict.reason


def test_snapshot_has_counts_and_latest_progress(store: RunStore) -> None:
    _run(store, "r1", "a")
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="ev", gpus=[])
    store.add_events(
        "r1", 1, [{"type": "progress", "ts": 1.0, "step": 1, "loss": 2.0, "samples_per_s": 5}], 10
    )
    store.add_events(
        "r1", 1, [{"type": "progress", "ts": 2.0, "step": 2, "loss": 1.0, "samples_per_s": 6}], 20
    )
    store.add_retune("r1", 1, {"bs": 8}, {"bs": 4})
    _run(store, "r2", "b")
    snap = {row["id"]: row for row in store.snapshot()}
    assert snap["r1"]["attempts"] == 1 and snap["r1"]["retunes"] == 1
    assert snap["r1"]["loss"] == 1.0 and snap["r1"]["samples_per_s"] == 6.0
    assert snap["r2"]["state"] == "queued" and snap["r2"]["loss"] is None


def test_gpu_processes_map_to_runs_by_process_group() -> None:
    import os

    from gpuwarden.daemon.supervise import owner_of

    assert owner_of(os.getpid(), {os.getpgid(0): "r1"}) == "r1"
    assert owner_of(os.getpid(), {os.getpgid(0) + 1: "r1"}) is None
    assert owner_of(2**22 + 12345, {}) is None  # no such process


def test_a_gang_attempt_keeps_an_events_offset_per_rank(store: RunStore) -> None:
    _run(store, "r1", "ddp")
    store.add_attempt(
        "r1", 1, stdout_path="o", stderr_path="e", events_path="/a/events.jsonl", gpus=[], world_size=3
    )
    assert store.rank_offsets("r1", 1) == {1: ("/a/events.rank1.jsonl", 0), 2: ("/a/events.rank2.jsonl", 0)}
    store.add_events(
        "r1", 1, [{"type": "progress", "ts": 1.0, "rank": 2, "step": 1, "samples_seen": 9}], 77, rank=2
    )
    store.add_events("r1", 1, [{"type": "progress", "ts": 1.0, "rank": 0, "step": 1, "samples_seen": 9}], 50)
    attempt = store.attempt("r1", 1)
    assert attempt is not None and attempt["world_size"] == 3 and attempt["events_offset"] == 50
    assert store.rank_offsets("r1", 1)[2] == ("/a/events.rank2.jsonl", 77)
    assert len(store.metrics("r1")) == 1  # the gang's progress is rank 0's
    (listed,) = store.attempts("r1")
    assert [r["step"] for r in listed["ranks"]] == [1, None, 1]
    store.delete_run("r1")
    assert store.rank_offsets("r1", 1) == {}


def test_a_v2_database_migrates_to_gangs_keeping_its_attempts(tmp_path: Path) -> None:
    from gpuwarden.core.store import migrations

    path = tmp_path / "v2.db"
    db = open_db(path)  # the current schema, then back to what v2 had
    db.conn.executescript(
        "DROP TABLE attempt_energy; DROP TABLE run_submissions; DROP TABLE run_environments;"
        " DROP TABLE rank_offsets;"
        " DROP INDEX run_events_attempt_type;"
        " ALTER TABLE attempts DROP COLUMN world_size; PRAGMA user_version = 2;"
    )
    old = RunStore(db)
    _run(old, "r1", "old")
    old.conn.execute(
        "INSERT INTO attempts (run_id, attempt, state, stdout_path, stderr_path, events_path)"
        " VALUES ('r1', 1, 'ended', 'o', 'e', 'v')"
    )
    db.conn.close()
    migrated = RunStore(open_db(path))
    assert migrations.SCHEMA_VERSION == 6
    (attempt,) = migrated.attempts("r1")
    assert attempt["world_size"] == 1 and attempt["ranks"] == []


def test_a_v3_database_migrates_to_stored_environments_keeping_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    db = open_db(path)  # the current schema, then back to what v3 had
    db.conn.executescript(
        "DROP TABLE attempt_energy; DROP TABLE run_submissions; DROP TABLE run_environments;"
        " PRAGMA user_version = 3;"
    )
    _run(RunStore(db), "r1", "old")
    db.conn.close()
    migrated = RunStore(open_db(path))
    assert migrated.environment("r1") is None  # submitted before: it starts from the daemon's
    migrated.create_run("r2", "new", "command", {"name": "new"}, "/runs/r2", environment={"FOO": "bar"})
    assert migrated.environment("r2") == {"FOO": "bar"}
    assert "bar" not in str(migrated.get_run("r2"))  # not part of what a run row shows
    migrated.delete_run("r2")
    assert migrated.environment("r2") is None


def test_a_v4_database_migrates_to_submit_keys_keeping_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    db = open_db(path)  # the current schema, then back to what v4 had
    db.conn.executescript("DROP TABLE attempt_energy; DROP TABLE run_submissions; PRAGMA user_version = 4;")
    _run(RunStore(db), "r1", "old")
    db.conn.close()
    migrated = RunStore(open_db(path))
    assert migrated.get_run("r1") is not None
    sent = Submission(key="key-00000001", digest="d1")
    migrated.create_run("r2", "new", "command", {"name": "new"}, "/runs/r2", submission=sent)
    assert migrated.submitted_as("key-00000001") == SubmittedRun(run_id="r2", digest="d1")
    assert "key-00000001" not in str(migrated.get_run("r2"))  # not part of what a run row shows
    with pytest.raises(sqlite3.IntegrityError):  # one key, one run
        migrated.create_run("r3", "new", "command", {"name": "new"}, "/runs/r3", submission=sent)
    assert migrated.get_run("r3") is None
    migrated.delete_run("r2")
    assert migrated.submitted_as("key-00000001") is None


def test_a_v5_database_migrates_to_attempt_energy_readings(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    db = open_db(path)  # the current schema, then back to what v5 had
    db.conn.executescript("DROP TABLE attempt_energy; PRAGMA user_version = 5;")
    _run(RunStore(db), "r1", "old")
    db.conn.close()
    assert RunStore(open_db(path, readonly=True)).attempts("r1") == []  # readable as it was
    migrated = RunStore(open_db(path))
    migrated.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="v", gpus=["GPU-a", "GPU-b"])
    migrated.add_attempt("r1", 2, stdout_path="o", stderr_path="e", events_path="v", gpus=["GPU-a"])
    add_readings(
        migrated.conn,
        [
            EnergyReading("r1", 1, "GPU-a", "start", 10.0, 5_000),
            EnergyReading("r1", 1, "GPU-a", "end", 12.0, 7_500),
            EnergyReading("r1", 1, "GPU-b", "start", 10.0, 9_000),  # its end was never read
            EnergyReading("r1", 2, "GPU-a", "start", 20.0, 9_000),
            EnergyReading("r1", 2, "GPU-a", "end", 22.0, 100),  # the driver reloaded meanwhile
        ],
    )
    first, second = migrated.attempts("r1")
    assert first["gpu_energy_j"] == {"GPU-a": 2.5} and second["gpu_energy_j"] == {}
    migrated.delete_run("r1")
    assert migrated.conn.execute("SELECT count(*) FROM attempt_energy").fetchone()[0] == 0
