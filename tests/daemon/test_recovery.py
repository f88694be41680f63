"""A daemon killed with -9 mid-run: the run goes on, and a new daemon re-adopts it with nothing lost."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle, command_spec

# Writes N numbered stdout lines and progress events, one every 0.1 s, then a `finished` event.
COUNTER = """
    import json, sys, time
    n, events = int(sys.argv[1]), sys.argv[2]
    for i in range(n):
        print(f"line {i}", flush=True)
        with open(events, "a") as fh:
            event = {"v": 1, "type": "progress", "ts": time.time(), "step": i, "samples_seen": i}
            fh.write(json.dumps(event) + "\\n")
        time.sleep(0.1)
    with open(events, "a") as fh:
        fh.write(json.dumps({"v": 1, "type": "finished", "ts": time.time(), "report": {"steps": n}}) + "\\n")
"""


def _counter_spec(name: str, n: int, **extra: Any) -> dict[str, Any]:
    spec = command_spec(name, COUNTER, **extra)
    spec["command"]["argv"] += [str(n), "{events_file}"]
    return spec


@pytest.mark.slow
def test_kill9_midrun_then_restart_readopts_with_complete_log_and_events(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    run = gw.submit(_counter_spec("counter", 80))
    running = gw.wait_state(run["id"], ("running",))
    pid = running["attempts"][0]["pid"]
    time.sleep(1.0)
    gw.kill9()
    os.kill(pid, 0)  # the run survived its daemon
    time.sleep(0.8)  # it keeps writing while no daemon watches
    gw.start()
    with gw.client() as client:
        adopted = client.run(run["id"])
        assert adopted.state == "running", adopted.message
        assert adopted.attempts[0].adopted is True
    done = gw.wait_state(run["id"], timeout=30)
    assert done["state"] == "succeeded", done["message"]
    assert "re-adopted" in done["message"]
    out = (Path(done["run_dir"]) / "attempts" / "1" / "stdout.log").read_text().splitlines()
    assert out == [f"line {i}" for i in range(80)]
    with gw.client() as client:
        events = [e.model_dump() for e in client.events(run["id"], limit=10_000).events]
    steps = [e["step"] for e in events if e["type"] == "progress"]
    assert steps == list(range(80)), "every event exactly once, in order"
    assert [e["type"] for e in events if e["type"] == "finished"] == ["finished"]
    assert any(e["type"] == "adopted" for e in events)


@pytest.mark.slow
def test_run_whose_process_died_with_the_daemon_is_interrupted_and_resumed(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    resumable = gw.submit(_counter_spec("resumable", 600, on_interrupt="resume"))
    left = gw.submit(_counter_spec("left", 600))
    pids = [gw.wait_state(r["id"], ("running",))["attempts"][0]["pid"] for r in (resumable, left)]
    gw.kill9()
    for pid in pids:
        os.killpg(pid, signal.SIGKILL)
    gw.start()
    with gw.client() as client:
        stays = client.run(left["id"])
        assert stays.state == "interrupted"
        assert stays.attempts[0].classification == "interrupted"
    again = gw.wait_state(resumable["id"], ("running",))
    assert again["attempt"] == 2
    states = [e["state"] for e in _events(gw, resumable["id"]) if e["type"] == "state"]
    assert states == ["queued", "starting", "running", "interrupted", "queued", "starting", "running"]


def test_run_that_finished_while_no_daemon_ran_is_succeeded_from_its_events(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    run = gw.submit(_counter_spec("quick", 8))
    gw.wait_state(run["id"], ("running",))
    gw.kill9()
    time.sleep(1.5)  # the run finishes meanwhile
    gw.start()
    done = gw.wait_state(run["id"])
    assert done["state"] == "succeeded"
    assert "exit status unknown" in done["message"]
    steps = [e["step"] for e in _events(gw, run["id"]) if e["type"] == "progress"]
    assert steps == list(range(8))


def _events(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [e.model_dump() for e in client.events(run_id, limit=10_000).events]


def test_partial_event_line_waits_for_its_newline(gw: DaemonHandle) -> None:
    code = """
        import json, sys, time
        line = json.dumps({"v": 1, "type": "warning", "ts": time.time(), "code": "x", "message": "half"})
        with open(sys.argv[1], "a") as fh:
            fh.write(line[:10]); fh.flush(); time.sleep(1.0)
            fh.write(line[10:] + "\\n"); fh.flush()
        time.sleep(0.5)
    """
    spec = command_spec("partial", code)
    spec["command"]["argv"].append("{events_file}")
    run = gw.submit(spec)
    gw.wait_state(run["id"], ("running",))
    time.sleep(0.6)
    assert [e for e in _events(gw, run["id"]) if e["type"] == "warning"] == []
    gw.wait_state(run["id"])
    warnings = [e for e in _events(gw, run["id"]) if e["type"] == "warning"]
    assert [w["message"] for w in warnings] == ["half"]
    assert json.loads(json.dumps(warnings[0]))["source"] == "runner"
