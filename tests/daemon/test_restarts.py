"""The restart policy with real runners: killed by a signal, restarted from the checkpoint, also
when the runner died while no daemon ran."""

from __future__ import annotations

import os
import resource
import signal
from typing import Any

import psutil
import pytest

from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

# Attempt 1 holds at step 20, right after that step's checkpoint, until the test kills it: the
# kill lands mid-run however fast or slow the machine is. The restarted attempt, resumed from that
# checkpoint, goes on to the end (see stall_hook).
RESTART = "{on: [signal, exit_code: [75]], max: 2, backoff: 0.5}"
TRAIN = """
    name: {name}
    kind: train
    env: {{OMP_NUM_THREADS: "1", {stall}: "0:20"}}
    resources: {{gpus: 0}}
    restart: {restart}
    train:
      task: image
      batch_size: 4
      max_steps: 40
      log_interval: 10
      checkpoint_interval: 20
      image: {{base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 64}}
"""


def _events(gw: DaemonHandle, run_id: str, type_: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        return [e.model_dump() for e in client.events(run_id, limit=10_000).events if e.type == type_]


@pytest.mark.slow
def test_a_runner_killed_by_a_signal_restarts_from_its_checkpoint_and_finishes(gw: DaemonHandle) -> None:
    spec = gw.write_spec("restarting", TRAIN.format(name="restarting", stall=STALL_ENV, restart=RESTART))
    run = gw.cli_json("run", str(spec))
    wait_for(lambda: _events(gw, run["id"], "checkpoint"), "a first complete checkpoint", timeout=120)
    os.kill(_runner_pid(gw, run["id"]), signal.SIGKILL)
    done = gw.wait_state(run["id"], timeout=300)
    assert done["state"] == "succeeded", done["message"]
    first, second = done["attempts"]
    assert first["classification"] == "failed" and first["signal"] == signal.SIGKILL
    assert second["classification"] == "succeeded" and second["restart"] is None
    assert first["restart"] == {"cause": "killed by SIGKILL", "restart": 1, "max": 2, "backoff_s": 0.5}
    (restart,) = _events(gw, run["id"], "restart")
    assert restart["attempt"] == 1 and restart["cause"] == "killed by SIGKILL"
    started = [e for e in _events(gw, run["id"], "started") if e["attempt"] == 2]
    assert started and started[0]["resumed_from"], "attempt 2 resumed from the checkpoint"
    steps = {n: [e["step"] for e in _events(gw, run["id"], "progress") if e["attempt"] == n] for n in (1, 2)}
    assert steps[1][-1] == 20  # held at the stall until killed
    assert steps[2][0] > 20 and steps[2][-1] == 40  # counted on from the checkpoint, to the end
    shown = gw.cli("show", run["id"])
    assert "restart 1 of 2 after 0.5 s: killed by SIGKILL" in shown.stdout, shown.stdout


@pytest.mark.slow
def test_runners_killed_while_no_daemon_ran_restart_or_fail_as_if_it_had_watched(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    policies = {
        "restarting": "{on: [signal], max: 2, backoff: 0.5}",
        "unlisted": "{on: [exit_code: [75]]}",
        # SIGTERM or SIGHUP is what a shutdown or a closed session sends every process: an
        # interruption, which on_interrupt decides (the stalled runner ends by SIGHUP at once).
        "shut-down": "{on: [exit_code: [75]]}\n    on_interrupt: resume",
    }
    runs: dict[str, dict[str, Any]] = {}
    for name, restart in policies.items():
        spec = gw.write_spec(name, TRAIN.format(name=name, stall=STALL_ENV, restart=restart))
        runs[name] = gw.cli_json("run", str(spec))
    attempts = [_at_checkpoint(gw, run["id"]) for run in runs.values()]
    gw.kill9()
    for attempt in attempts[:2]:
        _segfault(attempt["program_pid"])
    os.kill(attempts[2]["program_pid"], signal.SIGHUP)
    for attempt in attempts:
        _wait_gone(attempt["pid"])  # its recorder, once it wrote how the runner ended
    gw.start()

    done = gw.wait_state(runs["restarting"]["id"], timeout=300)
    assert done["state"] == "succeeded", done["message"]
    first, second = done["attempts"]
    assert second["classification"] == "succeeded" and not second["adopted"]
    assert (first["classification"], first["signal"]) == ("failed", signal.SIGSEGV)
    assert first["reason"] == "killed by SIGSEGV; ended while the daemon was down"
    assert first["restart"] == {"cause": "killed by SIGSEGV", "restart": 1, "max": 2, "backoff_s": 0.5}
    started = [e for e in _events(gw, done["id"], "started") if e["attempt"] == 2]
    assert started and started[0]["resumed_from"], "attempt 2 resumed from the checkpoint"
    shown = gw.cli("show", done["id"]).stdout
    assert "restart 1 of 2 after 0.5 s: killed by SIGSEGV" in shown, shown

    failed = gw.wait_state(runs["unlisted"]["id"])
    assert failed["state"] == "failed"
    assert failed["message"] == "attempt 1: killed by SIGSEGV; ended while the daemon was down"
    assert [a["signal"] for a in failed["attempts"]] == [signal.SIGSEGV]

    resumed = gw.wait_state(runs["shut-down"]["id"], timeout=300)
    assert resumed["state"] == "succeeded", resumed["message"]
    first, second = resumed["attempts"]
    assert first["classification"] == "interrupted" and first["restart"] is None
    assert first["reason"] == "process gone after a daemon restart (killed by SIGHUP)"
    assert second["classification"] == "succeeded"
    states = [e["message"] for e in _events(gw, resumed["id"], "state")]
    assert "resuming after an interruption (on_interrupt: resume)" in states, states


def test_without_the_policy_a_killed_run_fails_and_max_is_honoured(gw: DaemonHandle) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    plain = gw.submit(command_spec("plain", code))
    limited = gw.submit(command_spec("limited", code, restart={"on": ["signal"], "max": 1, "backoff": 0}))
    failed = gw.wait_state(plain["id"])
    assert failed["state"] == "failed" and "killed by SIGKILL" in failed["message"]
    assert failed["attempts"][0]["restart"] is None
    done = gw.wait_state(limited["id"])  # queued again after attempt 1; failed after attempt 2
    assert done["state"] == "failed" and done["attempt"] == 2
    assert done["message"] == "attempt 2: killed by SIGKILL; no restart left (1 used)"
    assert [a["restart"] is not None for a in done["attempts"]] == [True, False]
    assert [e["cause"] for e in _events(gw, limited["id"], "restart")] == ["killed by SIGKILL"]


def _detail(gw: DaemonHandle, run_id: str) -> dict[str, Any]:
    with gw.client() as client:
        return client.run(run_id).model_dump(mode="json")


def _runner_pid(gw: DaemonHandle, run_id: str) -> int:
    """The runner's own pid (the attempt's process is the exit-status recorder that started it)."""
    pid = _detail(gw, run_id)["attempts"][-1]["program_pid"]
    assert pid is not None
    return int(pid)


def _at_checkpoint(gw: DaemonHandle, run_id: str) -> dict[str, Any]:
    """The run's first attempt, once it has written its first checkpoint (and holds there)."""
    wait_for(lambda: _events(gw, run_id, "checkpoint"), "a first complete checkpoint", timeout=120)
    attempt: dict[str, Any] = _detail(gw, run_id)["attempts"][0]
    return attempt


def _segfault(pid: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # no core file of a torch process
    os.kill(pid, signal.SIGSEGV)


def _wait_gone(pid: int) -> None:
    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, f"pid {pid} to end while no daemon runs")
