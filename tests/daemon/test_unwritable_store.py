"""The database or the state folder stops taking writes while the daemon runs (a real `chattr +i`
where the filesystem has it): a fault the daemon reports and outlives, never a daemon bug."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.api import Health
from gpuwarden.core.errors import UserError
from tests.daemon.conftest import FINAL, DaemonHandle, Freeze, command_spec, wait_for

# A run that says where it is as events, waits for the test's go, then finishes.
STEPS = """
    import json, os, sys, time
    events, go = sys.argv[1:3]
    def emit(step):
        with open(events, "a") as fh:
            fh.write(json.dumps({"v": 1, "type": "progress", "ts": time.time(), "step": step,
                                 "samples_seen": step}) + "\\n")
    emit(0)
    while not os.path.exists(go):
        time.sleep(0.05)
    for step in range(1, 6):
        emit(step)
        time.sleep(0.05)
"""
LATER = """\
name: later
kind: command
resources: {gpus: 0}
command: {argv: ["true"]}
"""
# Lines a fault of a few seconds may add to the log: the fault, each refused request, recovery.
FEW_LINES = 8


def _health(gw: DaemonHandle) -> Health:
    with gw.client() as client:
        return client.health()


def _events(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [e.model_dump() for e in client.events(run_id, limit=10_000).events]


def _steps(gw: DaemonHandle, run_id: str) -> list[int]:
    return [e["step"] for e in _events(gw, run_id) if e["type"] == "progress"]


def _gone(pid: int) -> bool:
    """The process has ended and its parent (the daemon) has reaped it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _samples(gw: DaemonHandle) -> int:
    with gw.client() as client:
        series = client.history(window="5m", host=True, metrics=["mem_used"], points=1000).series
    return sum(len(s.get("mem_used", [])) for s in series.values())


def _wait_ticks(gw: DaemonHandle, ticks: int) -> None:
    """Until the sampler has stored `ticks` more samples: the daemon's loops have gone round."""
    target = _samples(gw) + ticks
    wait_for(lambda: _samples(gw) >= target, f"{ticks} more samples stored")


def _new_log(gw: DaemonHandle, start: int) -> str:
    return gw.log.read_bytes()[start:].decode("utf-8", "replace")


def test_an_unwritable_database_is_a_fault_the_run_outlives_and_catches_up(
    gw: DaemonHandle, freeze: Freeze
) -> None:
    go = gw.root / "go"
    spec = command_spec("outlives", STEPS, resources={"gpus": 0})
    spec["command"]["argv"] += ["{events_file}", str(go)]
    run = gw.submit(spec)
    wait_for(lambda: _steps(gw, run["id"]) == [0], "the run's first event stored")
    pid = gw.wait_state(run["id"], ("running",))["attempts"][0]["pid"]
    wal = gw.db.with_name(gw.db.name + "-wal")
    log_start = gw.log.stat().st_size
    freeze(gw.db, wal)

    refused = gw.cli("run", str(gw.write_spec("later", LATER)))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"gpuwarden: the daemon cannot write {gw.db}"), refused.stderr
    assert "immutable" in refused.stderr and f"chattr -i {gw.db}" in refused.stderr, refused.stderr
    with gw.client() as client, pytest.raises(UserError) as answer:
        client.submit({**spec, "name": "refused"})
    assert answer.value.code == "storage_unwritable"
    health = _health(gw)
    assert health.status == "degraded" and health.fault is not None
    assert health.fault.startswith(f"cannot write {gw.db}: marked immutable"), health.fault
    status = gw.cli("status")
    assert status.returncode == 0 and f"health: degraded — cannot write {gw.db}" in status.stdout, (
        status.stdout
    )

    go.touch()  # the run writes its last events and ends while nothing can be stored
    wait_for(lambda: _gone(pid), "the run's process to end and be reaped")
    wait_for(lambda: _health(gw).samples_dropped >= 20, "twenty samples the store refused")
    with gw.client() as client:
        assert client.run(run["id"]).state == "running", "nothing is decided before it can be recorded"
    during = _new_log(gw, log_start)
    assert "Traceback" not in during, during[-6000:]
    assert during.count("\n") <= FEW_LINES, during

    freeze.thaw()  # type: ignore[attr-defined]
    done = gw.wait_state(run["id"], FINAL)
    assert done["state"] == "succeeded", done["message"]
    assert done["attempts"][0]["exit_code"] == 0
    assert _steps(gw, run["id"]) == [0, 1, 2, 3, 4, 5], "every event stored once, in order"
    wait_for(lambda: _health(gw).status == "ok", "the daemon healthy again")
    assert _health(gw).fault is None
    assert "health: ok" in gw.cli("status").stdout
    after = _new_log(gw, log_start)
    assert f"{gw.db} can be written again" in after, after
    assert "Traceback" not in after, after[-6000:]
    assert gw.cli("run", str(gw.write_spec("later", LATER))).returncode == 0


def test_a_run_folder_that_cannot_be_written_waits_as_a_fault_not_a_bug(
    gw: DaemonHandle, freeze: Freeze
) -> None:
    go = gw.root / "go"
    holder = command_spec(
        "holder", "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
    )
    holder["command"]["argv"] += [str(go)]
    holder["resources"] = {"gpus": 2}
    first = gw.submit(holder)
    gw.wait_state(first["id"], ("running",))
    waiting = gw.submit(command_spec("waiting", "print('ran')"))
    run_dir = Path(waiting["run_dir"])
    log_start = gw.log.stat().st_size
    freeze(run_dir)

    go.touch()  # the GPUs free up: starting the waiting run needs a folder in its run folder
    gw.wait_state(first["id"], FINAL)
    wait_for(lambda: _health(gw).status == "degraded", "the daemon to report the fault")
    fault = _health(gw).fault
    assert fault is not None and fault.startswith(f"cannot write {run_dir}: marked immutable"), fault
    assert f"chattr -i {run_dir}" in fault
    _wait_ticks(gw, 20)  # the loop has tried again and again to start it
    with gw.client() as client:
        assert client.run(waiting["id"]).state == "queued"
    during = _new_log(gw, log_start)
    assert "Traceback" not in during, during[-6000:]
    assert during.count("\n") <= FEW_LINES, during

    freeze.thaw()  # type: ignore[attr-defined]
    done = gw.wait_state(waiting["id"], FINAL)
    assert done["state"] == "succeeded", done["message"]
    wait_for(lambda: _health(gw).status == "ok", "the daemon healthy again")
    assert "Traceback" not in _new_log(gw, log_start)


def test_a_state_folder_that_cannot_be_written_refuses_a_submit_in_one_line(
    gw: DaemonHandle, freeze: Freeze
) -> None:
    runs = gw.state_dir / "runs"
    freeze(runs)
    spec = str(gw.write_spec("later", LATER))
    refused = gw.cli("run", spec)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"gpuwarden: the daemon cannot write {runs}: marked immutable"), (
        refused.stderr
    )
    assert f"chattr -i {runs}" in refused.stderr
    health = _health(gw)
    assert health.status == "degraded" and health.fault is not None and str(runs) in health.fault
    assert "Traceback" not in gw.log.read_text()

    freeze.thaw()  # type: ignore[attr-defined]
    assert gw.cli("run", spec).returncode == 0
    assert _health(gw).status == "ok"


def _refusal(gw: DaemonHandle) -> tuple[str, str]:
    """What `up` and `daemon` print when they cannot start."""
    up = gw.cli("up")
    assert up.returncode == 2 and up.stderr.count("\n") == 1, up.stderr
    with contextlib.suppress(subprocess.TimeoutExpired):
        foreground = gw.cli("daemon", timeout=30)
        assert foreground.returncode == 2, foreground.stderr
        return up.stderr, foreground.stderr.splitlines()[-1] + "\n"
    raise AssertionError("`gpuwarden daemon` started on a database it cannot write")


def test_up_on_an_immutable_database_says_it_cannot_be_written(gw: DaemonHandle, freeze: Freeze) -> None:
    gw.stop()
    freeze(gw.db)
    for said in _refusal(gw):
        assert said.startswith(f"gpuwarden: {gw.db}: cannot be written (marked immutable) — "), said
        assert f"chattr -i {gw.db}" in said and "cannot create" not in said, said
