"""The restart policy: a failure that is not out of memory restarts after the backoff, at most
`max` times; without the policy (or for a stop, an OOM, an unlisted exit code) it does not."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command
from tests.supervise.test_retune import Halving

ON_SIGNAL = {"on": ["signal"], "max": 2, "backoff": 30}


def _killed(rig: Rig, run_id: str, sig: int = signal.SIGKILL) -> None:
    rig.proc_of(run_id).exit(sig=sig)
    rig.step()


def test_a_run_killed_by_a_signal_restarts_after_the_backoff(rig: Rig) -> None:
    run_id = rig.submit(command(restart=ON_SIGNAL))
    rig.step()
    _killed(rig, run_id)
    run = rig.run(run_id)
    assert run["state"] == RunState.QUEUED
    assert run["message"] == (
        "attempt 1: killed by SIGKILL; restart 1 of 2 in 30 s, from the last checkpoint"
    )
    (event,) = rig.events(run_id, "restart")
    assert (event["cause"], event["restart"], event["max"], event["backoff_s"]) == (
        "killed by SIGKILL",
        1,
        2,
        30,
    )
    rig.clock.advance(29.9)
    rig.step(3)
    assert rig.state(run_id) == RunState.QUEUED and len(rig.procs.spawned) == 1  # waits its backoff
    rig.clock.advance(0.1)
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == 2
    first, second = rig.attempts(run_id)
    assert first["restart"] == {"cause": "killed by SIGKILL", "restart": 1, "max": 2, "backoff_s": 30}
    assert second["restart"] is None
    rig.proc_of(run_id).exit(0)
    rig.step()
    assert rig.state(run_id) == RunState.SUCCEEDED
    assert rig.states(run_id) == [
        "queued",
        "starting",
        "running",
        "queued",
        "starting",
        "running",
        "succeeded",
    ]


def test_max_restarts_are_honoured(rig: Rig) -> None:
    run_id = rig.submit(command(restart={**ON_SIGNAL, "backoff": 0}))
    rig.step()
    for attempt in (2, 3):
        _killed(rig, run_id)  # no backoff: restarted in the same pass
        assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == attempt
    _killed(rig, run_id, signal.SIGSEGV)
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED and run["attempt"] == 3
    assert run["message"] == "attempt 3: killed by SIGSEGV; no restart left (2 used)"
    assert [e["restart"] for e in rig.events(run_id, "restart")] == [1, 2]


def test_listed_exit_codes_restart_and_others_fail(rig: Rig) -> None:
    policy: dict[str, Any] = {"on": [{"exit_code": [1, 75]}], "backoff": 0}
    listed, unlisted = (
        rig.submit(command("listed", restart=policy)),
        rig.submit(command("other", restart=policy)),
    )
    rig.step()
    rig.proc_of(listed).exit(75)
    rig.proc_of(unlisted).exit(7)
    rig.step()
    assert rig.state(listed) == RunState.RUNNING and rig.run(listed)["attempt"] == 2
    assert rig.events(listed, "restart")[0]["cause"] == "exit code 75"
    assert rig.state(unlisted) == RunState.FAILED and rig.events(unlisted, "restart") == []


def test_without_a_policy_a_killed_run_fails(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    _killed(rig, run_id)
    assert rig.state(run_id) == RunState.FAILED and rig.events(run_id, "restart") == []


def test_a_stop_an_outside_sigterm_and_an_oom_are_not_restarts(rig: Rig) -> None:
    rig.use(Hooks(retune=Halving()))
    policy = {"on": ["signal", {"exit_code": [EXIT_OOM]}], "backoff": 0}
    stopped, terminated, oom = (rig.submit(command(n, restart=policy, knobs={"bs": 8})) for n in "abc")
    rig.gpus.append(GpuState("GPU-2", 2, 80 << 30, 0))  # room for three
    rig.step()
    rig.sup.stop_run(stopped, grace=5)
    rig.proc_of(terminated).exit(sig=signal.SIGTERM)
    rig.proc_of(oom).emit("oom", verdict="gpu_capacity")
    rig.proc_of(oom).exit(EXIT_OOM)
    rig.step()
    assert rig.state(stopped) == RunState.STOPPED
    assert rig.state(terminated) == RunState.STOPPED
    assert rig.state(oom) == RunState.RETUNING  # the retune policy's, not the restart policy's
    assert all(rig.events(r, "restart") == [] for r in (stopped, terminated, oom))


def test_an_adopted_runner_that_dies_silently_says_so_and_restarts(rig: Rig) -> None:
    plain, restarting = rig.submit(command("plain")), rig.submit(command("restarting", restart=ON_SIGNAL))
    rig.step()
    rig.restart()  # both adopted: only their exit-status recorders could still tell how they end
    rig.proc_of(plain).exit(sig=signal.SIGKILL, recorded=False)
    rig.proc_of(restarting).exit(sig=signal.SIGKILL, recorded=False)
    rig.step()
    assert rig.run(plain)["message"] == (
        "attempt 1: the re-adopted process died without a final event (exit status unknown)"
    )
    assert rig.state(plain) == RunState.FAILED
    assert rig.state(restarting) == RunState.QUEUED
    assert rig.events(restarting, "restart")[0]["cause"] == "died without a final event"


def test_the_backoff_survives_a_daemon_restart(rig: Rig) -> None:
    run_id = rig.submit(command(restart=ON_SIGNAL))
    rig.step()
    _killed(rig, run_id)
    rig.clock.advance(10)
    rig.restart()
    rig.step()
    assert rig.state(run_id) == RunState.QUEUED  # 20 s of the backoff are left
    rig.clock.advance(20)
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING


def test_a_person_resuming_starts_at_once(rig: Rig) -> None:
    run_id = rig.submit(command(restart={**ON_SIGNAL, "max": 1, "backoff": 0}))
    rig.step()
    _killed(rig, run_id)
    _killed(rig, run_id)
    assert rig.state(run_id) == RunState.FAILED
    rig.sup.resume_run(run_id)
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == 3


def test_an_adopted_command_run_restarts_by_its_recorded_exit_code(rig: Rig) -> None:
    policy = {"on": [{"exit_code": [5]}], "max": 1, "backoff": 0}
    listed, unlisted = rig.submit(command("listed", restart=policy)), rig.submit(command("unlisted"))
    rig.step()
    rig.restart()
    rig.proc_of(listed).exit(5)
    rig.proc_of(unlisted).exit(5)
    rig.step()
    assert rig.events(listed, "restart")[0]["cause"] == "exit code 5"
    assert rig.run(unlisted)["message"] == "attempt 1: exit code 5"
    assert rig.state(unlisted) == RunState.FAILED


def test_a_stop_during_the_backoff_says_the_run_ran_and_it_is_not_restarted(rig: Rig) -> None:
    run_id = rig.submit(command(restart=ON_SIGNAL))
    rig.step()
    _killed(rig, run_id)
    assert rig.state(run_id) == RunState.QUEUED  # waiting out its 30 s
    rig.sup.stop_run(run_id)
    run = rig.run(run_id)
    assert run["state"] == RunState.STOPPED
    assert run["message"] == "stopped while waiting to start attempt 2 (attempt 1 ran)"
    rig.clock.advance(31)
    rig.step(2)
    assert rig.state(run_id) == RunState.STOPPED and len(rig.procs.spawned) == 1  # never restarted
    never_started = rig.submit(command(name="later"))
    rig.sup.stop_run(never_started)
    assert rig.run(never_started)["message"] == "stopped before it started"


def test_a_run_waiting_for_its_restart_is_not_removed_until_stopped(rig: Rig) -> None:
    run_id = rig.submit(command(restart=ON_SIGNAL))
    rig.step()
    _killed(rig, run_id)
    assert rig.state(run_id) == RunState.QUEUED  # its back-off: attempt 1 ran, checkpoints kept
    with pytest.raises(UserError, match=rf"run {run_id} is queued — stop it first"):
        rig.sup.delete_run(run_id)
    assert rig.state(run_id) == RunState.QUEUED
    rig.sup.stop_run(run_id)
    rig.sup.delete_run(run_id)
    assert rig.sup.ctx.find(run_id) is None
