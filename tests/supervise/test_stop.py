"""Stop: SIGTERM to the process group, the grace period on the supervisor's clock, then SIGKILL."""

from __future__ import annotations

import signal

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from tests.supervise.conftest import Rig, command


def test_a_run_that_ignores_sigterm_is_killed_when_the_grace_period_ends(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.sup.stop_run(run_id, grace=30)
    assert proc.signals == [signal.SIGTERM]
    rig.clock.advance(29.9)
    rig.step(3)
    assert proc.signals == [signal.SIGTERM] and rig.state(run_id) == RunState.RUNNING
    rig.clock.advance(0.1)
    rig.step()  # the deadline: SIGKILL to the group
    assert proc.signals == [signal.SIGTERM, signal.SIGKILL]
    rig.step()  # the process is gone: the attempt ends
    run = rig.run(run_id)
    assert run["state"] == RunState.STOPPED and run["stop_requested"]
    (attempt,) = rig.attempts(run_id)
    assert attempt["signal"] == signal.SIGKILL and attempt["classification"] == "stopped"
    assert [e["grace_seconds"] for e in rig.events(run_id, "stopping")] == [30]


def test_a_run_that_obeys_sigterm_stops_within_the_grace_period(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.group_members = 0
    rig.sup.stop_run(run_id)  # the settings' grace period
    rig.step()
    assert proc.signals == [signal.SIGTERM]
    assert rig.run(run_id)["message"] == "attempt 1: stopped on request (killed by SIGTERM)"


def test_a_queued_run_stops_at_once_and_a_stopped_one_cannot_stop_again(rig: Rig) -> None:
    rig.gpus = rig.gpus[:1]
    rig.submit(command("holder"))
    rig.step()
    run_id = rig.submit(command("waiting"))
    stopped = rig.sup.stop_run(run_id)
    assert stopped["state"] == RunState.STOPPED and stopped["message"] == "stopped before it started"
    with pytest.raises(UserError) as again:
        rig.sup.stop_run(run_id)
    assert again.value.code == "conflict"


def test_sigterm_from_outside_gpuwarden_stops_the_run(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    rig.proc_of(run_id).exit(sig=signal.SIGTERM)
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.STOPPED and "terminated from outside gpuwarden" in run["message"]


def test_a_stop_under_way_when_the_daemon_restarts_still_ends_in_sigkill_on_time(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.sup.stop_run(run_id, grace=30)
    rig.clock.advance(10)
    rig.restart()  # the new daemon is not the one that signalled
    rig.step()
    assert proc.signals == [signal.SIGTERM]  # not a second SIGTERM: some programs hard-exit on one
    rig.clock.advance(19.9)
    rig.step(2)
    assert proc.signals == [signal.SIGTERM] and rig.state(run_id) == RunState.RUNNING
    rig.clock.advance(0.1)
    rig.step(2)
    assert proc.signals == [signal.SIGTERM, signal.SIGKILL]
    assert rig.state(run_id) == RunState.STOPPED


def test_a_stop_whose_grace_ran_out_while_no_daemon_watched_is_killed_at_adoption(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.sup.stop_run(run_id, grace=5)
    rig.clock.advance(60)
    rig.restart()
    rig.step(2)
    assert proc.signals == [signal.SIGTERM, signal.SIGKILL] and rig.state(run_id) == RunState.STOPPED
