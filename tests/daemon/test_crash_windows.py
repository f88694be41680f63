"""`kill -9` of a real daemon while a run is retuning, with its probe process running: the
restarted daemon kills the probe, removes its folder, decides the retune again and records it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.daemon.process import RUN_TAG, run_tag
from tests.daemon.conftest import DaemonHandle, wait_for

REPO = Path(__file__).resolve().parents[2]
# The shipped example: micro-batch 32 cannot fit in 1.4 GiB, so the retune probes two smaller ones.
SPEC = (REPO / "configs" / "examples" / "oom-recovery-cpu.yaml").read_text()


def _probes(run_id: str) -> list[psutil.Process]:
    """The run's probe processes (their environment carries the run's probe tag)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_TAG) == run_tag(run_id, None) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_daemon_killed_while_a_run_retunes_finishes_the_retune_when_restarted(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    spec_path = gw.write_spec("oom-recovery-cpu", SPEC)
    submitted = gw.cli_json("run", str(spec_path))
    run_id = submitted["id"]
    gw.wait_state(run_id, ("retuning",), timeout=300)
    probe = wait_for(lambda: _probes(run_id)[:1], "a probe process of the retune", timeout=120)[0]
    probe_dir = Path(submitted["run_dir"]) / "probes" / "after-1"
    assert probe_dir.exists()

    gw.kill9()
    assert _alive(probe)  # the probe outlived its daemon: an orphan until the restart
    gw.start()
    wait_for(lambda: not _alive(probe), "the leftover probe to be killed", timeout=30)
    run = gw.wait_state(run_id, ("starting", "running", "succeeded", "failed"), timeout=300)
    assert run["state"] != "failed", run["message"]
    detail = gw.cli_json("show", run_id)
    (retune,) = detail["retunes"]  # decided once, by the restarted daemon, and recorded
    assert retune["attempt"] == 1 and retune["verdict"] == "host_oom"
    assert retune["to"]["train.batch_size"] < 32
    assert detail["attempts"][0]["classification"] == "oom" and len(detail["attempts"]) == 2
    with gw.client() as client:
        messages = [
            str(e.model_dump()["message"])
            for e in client.events(run_id, limit=10_000).events
            if e.type == "state"
        ]
    assert any(m.endswith("deciding the retune again after a daemon restart") for m in messages)
    assert not any("process gone" in (m or "") for m in messages)
    assert not probe_dir.exists()  # removed with the decision
    assert _probes(run_id) == []
    with gw.client() as client:
        client.stop(run_id, grace_seconds=0)
