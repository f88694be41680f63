"""After a daemon restart: live attempts are adopted; dead ones are settled by what they wrote."""

from __future__ import annotations

import os
import signal

import pytest

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.exit_record import STATUS_FILE
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import DIED_SILENTLY, RUN_TAG
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command, train
from tests.supervise.test_gang import Recording, start_gang


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
    assert run["message"] == "attempt 1: exit code 0"  # not our child any more: its recorder says


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


def test_an_attempt_that_ended_while_no_daemon_ran_ends_when_its_status_was_recorded(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.exit(5)
    assert proc.exit_file is not None
    ended = rig.clock() + 7  # the recorder wrote the status then; the daemon came back much later
    os.utime(proc.exit_file, (ended, ended))
    rig.clock.advance(3600)
    rig.restart()
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED and run["ended_at"] == ended
    assert rig.attempts(run_id)[0]["ended_at"] == ended


def test_a_dead_attempt_with_nothing_said_is_interrupted(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    rig.proc_of(run_id).exit(sig=9, recorded=False)
    rig.restart()
    run = rig.run(run_id)
    assert run["state"] == RunState.INTERRUPTED and "gpuwarden resume" in run["message"]
    assert rig.attempts(run_id)[0]["classification"] == "interrupted"
    rig.step(3)
    assert rig.state(run_id) == RunState.INTERRUPTED  # waits for a person


def test_on_interrupt_resume_queues_the_run_again(rig: Rig) -> None:
    run_id = rig.submit(command(on_interrupt="resume"))
    rig.step()
    rig.proc_of(run_id).exit(sig=9, recorded=False)
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


def test_an_adopted_command_run_that_exits_0_without_a_final_event_succeeds(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    assert proc.exit_file == proc.stdout.parent / STATUS_FILE  # in the attempt's own folder
    rig.restart()
    proc.exit(0)  # a plain script: no finished event, only its recorder's status file
    rig.step()
    run = rig.run(run_id)
    assert (run["state"], run["message"]) == (RunState.SUCCEEDED, "attempt 1: exit code 0")
    (attempt,) = rig.attempts(run_id)
    assert (attempt["exit_code"], attempt["signal"], attempt["adopted"]) == (0, None, True)


def test_a_command_run_that_ended_while_no_daemon_ran_goes_by_its_recorded_status(rig: Rig) -> None:
    ok, bad = rig.submit(command("ok")), rig.submit(command("bad"))
    rig.step()
    rig.proc_of(ok).exit(0)
    rig.proc_of(bad).exit(5)
    rig.restart()
    assert rig.run(ok)["state"] == RunState.SUCCEEDED
    assert rig.run(ok)["message"] == "attempt 1: exit code 0; ended while the daemon was down"
    assert rig.run(bad)["state"] == RunState.FAILED
    assert rig.run(bad)["message"] == "attempt 1: exit code 5; ended while the daemon was down"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"\xff\xfe",
        b"[0]",
        b'{"code": "0"}',
        b'{"code": true}',
        b'{"code": 0, "signal": 9}',
        b'{"code": 1000}',
        b'{"code": 0}' + b" " * 100_000,
    ],
)
def test_a_status_file_that_is_no_status_counts_as_unknown(rig: Rig, content: bytes) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.restart()
    proc.exit(0, recorded=False)
    assert proc.exit_file is not None
    proc.exit_file.write_bytes(content)
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED
    assert run["message"] == f"attempt 1: {DIED_SILENTLY}"


ON_SIGNAL = {"on": ["signal"], "max": 2, "backoff": 0}
# torchrun's summary after rank 1 died of SIGSEGV (trimmed): rank 0 then stopped as gang_aborted.
SEGV_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 9101)
  error_file: <N/A>
============================================================
"""


def test_a_runner_killed_while_no_daemon_ran_is_restarted_by_its_recorded_signal(rig: Rig) -> None:
    restarting, plain = rig.submit(train("restarting", restart=ON_SIGNAL)), rig.submit(train("plain"))
    rig.gpus.append(GpuState("GPU-1", 1, 80 << 30, 0))  # room for both
    rig.step()
    assert all(rig.proc_of(r).exit_file is not None for r in (restarting, plain))
    for run_id in (restarting, plain):
        rig.proc_of(run_id).emit("progress", step=3, samples_seen=48)
        rig.proc_of(run_id).exit(sig=signal.SIGSEGV)  # no final event: only its recorder tells
    rig.restart()
    assert rig.state(restarting) == RunState.QUEUED
    assert [e["cause"] for e in rig.events(restarting, "restart")] == ["killed by SIGSEGV"]
    assert rig.attempts(restarting)[0]["signal"] == signal.SIGSEGV
    rig.step()
    assert rig.run(restarting)["attempt"] == 2 and rig.state(restarting) == RunState.RUNNING
    run = rig.run(plain)
    assert run["state"] == RunState.FAILED
    assert run["message"] == "attempt 1: killed by SIGSEGV; ended while the daemon was down"


def test_a_runners_oom_while_no_daemon_ran_is_retuned(rig: Rig) -> None:
    hook = Recording()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(train(restart=ON_SIGNAL))
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("oom", verdict="gpu_capacity", message="CUDA out of memory", batch_size=16, step=3)
    proc.exit(EXIT_OOM)
    rig.restart()
    (end,) = hook.ends
    assert (end.outcome, end.exit_code, end.adopted) == ("oom", EXIT_OOM, True)
    assert rig.state(run_id) == RunState.RETUNING
    rig.step()
    assert [r["attempt"] for r in rig.retunes(run_id)] == [1]
    assert rig.run(run_id)["attempt"] == 2 and rig.state(run_id) == RunState.RUNNING
    assert rig.events(run_id, "restart") == []  # the retune's, not the restart policy's


def test_a_gangs_rank_killed_while_no_daemon_ran_restarts_the_gang_by_that_ranks_signal(rig: Rig) -> None:
    run_id, proc = start_gang(rig, restart=ON_SIGNAL)
    assert proc.exit_file is not None  # torchrun's recorder
    proc.emit("error", rank=0, code="gang_aborted", message="rank 0 stopped: another rank stopped first")
    proc.write_stderr(SEGV_SUMMARY)
    proc.exit(1)  # torchrun, once a rank failed
    rig.restart()
    (attempt,) = [a for a in rig.attempts(run_id) if a["attempt"] == 1]
    assert attempt["reason"] == "rank 1: failed (killed by SIGSEGV); ended while the daemon was down"
    assert [e["cause"] for e in rig.events(run_id, "restart")] == ["killed by SIGSEGV"]
    assert rig.state(run_id) == RunState.QUEUED
