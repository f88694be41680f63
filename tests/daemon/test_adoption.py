"""A daemon killed with -9 mid-run: the run goes on, and a new daemon re-adopts it with nothing lost.

Real processes end to end; the adoption logic case by case is driven in-process in
tests/supervise/test_adoption.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

# Writes N numbered stdout lines and progress events, one every 0.1 s, then a `finished` event.
# With a gate (a path and a line number) it holds after that line until the gate file exists, so
# a test decides when the run may end instead of racing it.
COUNTER = """
    import json, os, sys, time
    n, events = int(sys.argv[1]), sys.argv[2]
    gate, hold_at = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, -1)
    for i in range(n):
        print(f"line {i}", flush=True)
        with open(events, "a") as fh:
            event = {"v": 1, "type": "progress", "ts": time.time(), "step": i, "samples_seen": i}
            fh.write(json.dumps(event) + "\\n")
        while i == hold_at and not os.path.exists(gate):
            time.sleep(0.05)
        time.sleep(0.1)
    with open(events, "a") as fh:
        fh.write(json.dumps({"v": 1, "type": "finished", "ts": time.time(), "report": {"steps": n}}) + "\\n")
"""


def _counter_spec(name: str, n: int, gate: tuple[Path, int] | None = None, **extra: Any) -> dict[str, Any]:
    spec = command_spec(name, COUNTER, **extra)
    spec["command"]["argv"] += [str(n), "{events_file}", *([str(gate[0]), str(gate[1])] if gate else [])]
    return spec


@pytest.mark.slow
def test_kill9_midrun_then_restart_readopts_with_complete_log_and_events(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    gate = gw.root / "let-it-finish"
    run = gw.submit(_counter_spec("counter", 80, gate=(gate, 40)))
    running = gw.wait_state(run["id"], ("running",))
    pid = running["attempts"][0]["pid"]
    stdout = Path(running["run_dir"]) / "attempts" / "1" / "stdout.log"
    wait_for(lambda: len(_progress(gw, run["id"])) >= 5, "five progress events stored")
    gw.kill9()
    os.kill(pid, 0)  # the run survived its daemon
    # Lines 5..40 at least are written while no daemon watches; then the run holds at the gate.
    wait_for(lambda: _lines(stdout) >= 41, "the run to write while no daemon watches", timeout=120)
    gw.start()
    with gw.client() as client:
        adopted = client.run(run["id"])
        assert adopted.state == "running", adopted.message
        assert adopted.attempts[0].adopted is True
    gate.touch()
    done = gw.wait_state(run["id"], timeout=120)
    assert done["state"] == "succeeded", done["message"]
    assert done["message"] == "attempt 1: exit code 0"  # not our child: its recorder said so
    assert stdout.read_text().splitlines() == [f"line {i}" for i in range(80)]
    assert [e["step"] for e in _progress(gw, run["id"])] == list(range(80)), (
        "every event exactly once, in order"
    )
    events = _events(gw, run["id"])
    assert [e["type"] for e in events if e["type"] == "finished"] == ["finished"]
    assert any(e["type"] == "adopted" for e in events)


def test_run_that_finished_while_no_daemon_ran_is_succeeded_from_its_events(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    run = gw.submit(_counter_spec("quick", 8))
    pid = gw.wait_state(run["id"], ("running",))["attempts"][0]["pid"]
    gw.kill9()
    wait_for(lambda: not _alive(pid), "the run to finish while no daemon runs")
    gw.start()
    done = gw.wait_state(run["id"])
    assert done["state"] == "succeeded"
    assert done["message"] == "attempt 1: exit code 0; ended while the daemon was down"
    steps = [e["step"] for e in _events(gw, run["id"]) if e["type"] == "progress"]
    assert steps == list(range(8))


# A plain script (no events): runs until its gate file exists, then exits with the code it is given.
GATED = """
    import os, sys, time
    gate, code = sys.argv[1], int(sys.argv[2])
    while not os.path.exists(gate):
        time.sleep(0.05)
    sys.exit(code)
"""


def _gated_spec(name: str, gate: Path, code: int, **extra: Any) -> dict[str, Any]:
    spec = command_spec(name, GATED, resources={"gpus": 0}, **extra)
    spec["command"]["argv"] += [str(gate), str(code)]
    return spec


def test_a_plain_script_readopted_after_down_and_up_ends_with_its_real_exit_status(
    daemon_factory: Any,
) -> None:
    gw: DaemonHandle = daemon_factory()
    gate = gw.root / "let-them-end"
    ok = gw.submit(_gated_spec("ok", gate, 0))
    bad = gw.submit(_gated_spec("bad", gate, 5, restart={"on": [{"exit_code": [5]}], "max": 1, "backoff": 0}))
    for run in (ok, bad):
        gw.wait_state(run["id"], ("running",))
    gw.stop()  # `gpuwarden down`: the runs go on without a daemon
    gw.start()
    with gw.client() as client:
        assert all(client.run(r["id"]).attempts[0].adopted for r in (ok, bad))
    gate.touch()
    done = gw.wait_state(ok["id"])
    assert (done["state"], done["message"]) == ("succeeded", "attempt 1: exit code 0")
    assert done["attempts"][0]["exit_code"] == 0
    done = gw.wait_state(bad["id"])  # restarted once by its policy; attempt 2 meets the open gate
    assert done["state"] == "failed"
    first, second = done["attempts"]
    assert (first["classification"], first["reason"], first["exit_code"]) == ("failed", "exit code 5", 5)
    assert (second["adopted"], second["exit_code"]) == (False, 5)
    assert [e["cause"] for e in _events(gw, bad["id"]) if e["type"] == "restart"] == ["exit code 5"]


def _events(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [e.model_dump() for e in client.events(run_id, limit=10_000).events]


def _progress(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    return [e for e in _events(gw, run_id) if e["type"] == "progress"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
