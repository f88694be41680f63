"""After a daemon restart: live attempts are adopted; dead ones are settled by what they wrote."""

from __future__ import annotations

from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.process import RUN_TAG
from tests.supervise.conftest import Rig, command


def test_a_live_attempt_is_adopted_and_its_events_continue(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("progress", step=1, samples_seen=8)
    rig.step()
    proc.emit("progress", step=2, samples_seen=16)  # written while no daemon watches
    rig.restart()
    assert run_id in rig.sup.active and rig.sup.active[run_id].child.adopted
    assert rig.state(run_id) == RunState.RUNNING
    assert [e["step"] for e in rig.events(run_id, "progress")] == [1, 2]  # each exactly once
    assert [e["pid"] for e in rig.events(run_id, "adopted")] == [proc.pid]
    assert rig.attempts(run_id)[0]["adopted"] is True
    proc.emit("finished", report={})
    proc.exit(0)
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.SUCCEEDED
    assert "exit status unknown" in run["message"]  # not our child any more


def test_an_attempt_that_finished_while_no_daemon_ran_succeeds_from_its_events(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("finished", report={})
    proc.exit(0)
    rig.restart()
    run = rig.run(run_id)
    assert run["state"] == RunState.SUCCEEDED
    assert run["message"].endswith("; ended while the daemon was down")
    assert rig.sup.active == {}


def test_a_dead_attempt_with_nothing_said_is_interrupted(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    rig.proc_of(run_id).exit(sig=9)
    rig.restart()
    run = rig.run(run_id)
    assert run["state"] == RunState.INTERRUPTED and "gpuwarden resume" in run["message"]
    assert rig.attempts(run_id)[0]["classification"] == "interrupted"
    rig.step(3)
    assert rig.state(run_id) == RunState.INTERRUPTED  # waits for a person


def test_on_interrupt_resume_queues_the_run_again(rig: Rig) -> None:
    run_id = rig.submit(command(on_interrupt="resume"))
    rig.step()
    rig.proc_of(run_id).exit(sig=9)
    rig.restart()
    assert rig.state(run_id) == RunState.QUEUED
    rig.step()
    assert rig.run(run_id)["attempt"] == 2 and rig.state(run_id) == RunState.RUNNING
    assert rig.states(run_id) == [
        "queued",
        "starting",
        "running",
        "interrupted",
        "queued",
        "starting",
        "running",
    ]


def test_a_run_whose_stop_was_requested_is_stopped_when_its_process_is_gone(rig: Rig) -> None:
    rig.procs.ignores_sigterm = True
    run_id = rig.submit(command(on_interrupt="resume"))
    rig.step()
    rig.sup.stop_run(run_id, grace=60)
    rig.proc_of(run_id).exit(sig=9)
    rig.restart()
    assert rig.state(run_id) == RunState.STOPPED


def test_a_reused_pid_is_not_adopted(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.create_time += 5  # same pid, another process (which carries no run tag)
    proc.env.pop(RUN_TAG)
    rig.restart()
    assert run_id not in rig.sup.active
    assert rig.state(run_id) == RunState.INTERRUPTED
    assert proc.signals == []  # never signal a stranger's group
