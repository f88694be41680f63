"""The daemon path: a real daemon (fake H100s) supervises a run; report/doctor read it over the
API, and agree with the same run read from the daemon's database."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.client.run_data import ApiRunData
from gpuwarden.core.doctor.diagnose import diagnose_run
from gpuwarden.core.report.db_data import DbRunData
from gpuwarden.core.report.performance import build_report
from gpuwarden.core.report.snapshot import collect_run
from tests.daemon.conftest import DaemonHandle, command_spec


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHandle]:
    runtime = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))  # socket paths must stay short
    handle = DaemonHandle(tmp_path, runtime)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
        handle.kill_runs()
        shutil.rmtree(runtime, ignore_errors=True)


def test_report_and_doctor_over_the_api_match_the_database(daemon: DaemonHandle) -> None:
    run = daemon.submit(command_spec("sleeper", "import time; time.sleep(3)"))
    done = daemon.wait_state(run["id"], timeout=30)
    assert done["state"] == "succeeded"
    with daemon.client() as client:
        api = ApiRunData(client)
        via_api = build_report(collect_run(api, "sleeper"))
        diagnosis = diagnose_run(api, "sleeper")
    db = DbRunData(daemon.db)
    try:
        via_db = build_report(collect_run(db, "sleeper"))
    finally:
        db.close()
    assert via_api["attempts"] == via_db["attempts"] and len(via_api["attempts"]) == 1
    gpus = via_api["attempts"][0]["gpus"]
    assert len(gpus) == 1 and gpus[0].startswith("GPU-")
    # the fake's power follows its utilisation pattern: both sources see the same samples
    # one bucket a second over the ~3 s attempt (the daemon samples every 0.25 s)
    assert via_api["power"]["n"] == via_db["power"]["n"] >= 3
    assert via_api["power"]["mean_w"] == pytest.approx(via_db["power"]["mean_w"])
    assert via_api["energy"]["joules"] == pytest.approx(via_db["energy"]["joules"])
    assert via_api["energy"]["joules"] > 0
    assert via_api["memory"]["capacity_bytes"] == via_db["memory"]["capacity_bytes"] > 0
    assert not any("process history" in n for n in diagnosis.notes)
    assert not [f for f in diagnosis.findings if f.id == "other-processes"]
    assert diagnosis.device.device == "gpu" and "H100" in diagnosis.device.source


def _put_foreign_process(db: Path, uuid: str, ts: float, pid: int) -> None:
    """A process read as the daemon stores it: someone else's job on the run's GPU at `ts`."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        with conn:
            (gid,) = conn.execute("SELECT id FROM gpus WHERE uuid = ?", (uuid,)).fetchone()
            conn.execute("INSERT OR IGNORE INTO process_scans (ts) VALUES (?)", (round(ts * 1000),))
            conn.execute(
                "INSERT INTO gpu_processes (ts, gpu_id, pid, used_memory, kind, name, cmdline, user)"
                " VALUES (?, ?, ?, ?, 'compute', 'ollama', 'ollama serve', 'alice')",
                (round(ts * 1000), gid, pid, 6 * 1024**3),
            )
    finally:
        conn.close()


def test_doctor_over_the_api_sees_other_processes_from_the_stored_reads(daemon: DaemonHandle) -> None:
    run = daemon.submit(command_spec("shared", "import time; time.sleep(2)"))
    done = daemon.wait_state(run["id"], timeout=30)
    assert done["state"] == "succeeded"
    with daemon.client() as client:
        (attempt,) = client.run(run["id"]).attempts
        assert attempt.started_at is not None and attempt.ended_at is not None
        uuid = attempt.gpus[0]
        middle = (attempt.started_at + attempt.ended_at) / 2
        _put_foreign_process(daemon.db, uuid, middle, 999_999)
        _put_foreign_process(daemon.db, uuid, attempt.ended_at + 60, 888_888)  # after the run

        # The API's stored reads: the window is [since, until), one GPU, and a cut is flagged.
        answer = client.process_history(middle - 1, middle + 1, gpu=uuid)
        assert [p.pid for p in answer.processes] == [999_999] and answer.truncated is False
        assert answer.processes[0].user == "alice"

        diagnosis = diagnose_run(ApiRunData(client), "shared")
    found = [f for f in diagnosis.findings if f.id == "other-processes"]
    assert len(found) == 1 and [p["pid"] for p in found[0].evidence["processes"]] == [999_999]
    db = DbRunData(daemon.db)
    try:
        via_db = diagnose_run(db, "shared")
    finally:
        db.close()
    assert [f.evidence for f in via_db.findings if f.id == "other-processes"] == [found[0].evidence]

    # Retention drops the reads of the run's time: both paths say the check was not made.
    conn = sqlite3.connect(daemon.db, timeout=10)
    try:
        with conn:
            cut = round((attempt.ended_at + 1) * 1000)
            conn.execute("DELETE FROM process_scans WHERE ts < ?", (cut,))
            conn.execute("DELETE FROM gpu_processes WHERE ts < ?", (cut,))
    finally:
        conn.close()
    with daemon.client() as client:
        via_api = diagnose_run(ApiRunData(client), "shared")
    db = DbRunData(daemon.db)
    try:
        via_db = diagnose_run(db, "shared")
    finally:
        db.close()
    for diagnosis in (via_api, via_db):
        assert not [f for f in diagnosis.findings if f.id == "other-processes"]
        assert any("no process reads are kept" in n for n in diagnosis.notes), diagnosis.notes
