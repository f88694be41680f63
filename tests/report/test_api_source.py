"""The daemon path: a real daemon (fake H100s) supervises a run; report/doctor read it over the
API, and agree with the same run read from the daemon's database."""

from __future__ import annotations

import shutil
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
    # over the API no process history exists: doctor says so instead of guessing
    assert any("process history" in n for n in diagnosis.notes)
    assert diagnosis.device.device == "gpu" and "H100" in diagnosis.device.source
