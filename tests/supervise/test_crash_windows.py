"""A daemon that dies at the worst moment: while a run retunes (probes running), or between
spawning an attempt and recording its pid. The restarted daemon finishes what was under way and
leaves no orphan."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.run_state import RunState
from gpuwarden.core.store.runs import RunStore
from gpuwarden.daemon.process import RUN_TAG, run_tag
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command
from tests.supervise.test_retune import Halving


class DaemonDied(BaseException):
    """The daemon was killed: nothing after this point of the pass ran."""


def _oom_then_die_while_probing(rig: Rig, hook: Halving) -> tuple[str, Path]:
    """A run that ran out of memory; its retune is probing when the daemon dies."""
    rig.use(Hooks(retune=hook))
    rig.workers.hold = True  # the policy is still thinking when the daemon dies
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("oom", verdict="gpu_capacity")
    proc.exit(EXIT_OOM)
    rig.step()
    assert rig.state(run_id) == RunState.RETUNING
    probes = Path(rig.run(run_id)["run_dir"]) / "probes" / "after-1"
    (probes / "probe-1").mkdir(parents=True)
    rig.workers.pending.clear()  # the retune thread died with its daemon
    rig.workers.hold = False
    return run_id, probes


def test_a_retune_interrupted_by_a_daemon_restart_is_decided_again(rig: Rig) -> None:
    hook = Halving()
    run_id, probes = _oom_then_die_while_probing(rig, hook)
    probe = rig.procs.start_probe(run_id, probes / "probe-1")
    rig.restart()
    assert probe.signals == [signal.SIGKILL] and not probe.group_alive  # the probe died with the decision
    assert not probes.exists()
    assert rig.run(run_id)["message"].endswith("deciding the retune again after a daemon restart")
    ((end, _),) = hook.calls  # decided once: by the restarted daemon
    assert end.number == 1 and end.exit_code == EXIT_OOM and end.gpus == ["GPU-0"]
    rig.step()  # the loop applies the decision
    run = rig.run(run_id)
    assert run["state"] == RunState.RUNNING and run["attempt"] == 2 and run["spec"]["knobs"]["bs"] == 8
    assert [(r["attempt"], r["to"]) for r in rig.retunes(run_id)] == [(1, {"bs": 8})]
    assert rig.states(run_id)[-4:] == ["retuning", "retuning", "starting", "running"]


def test_a_retune_recorded_just_before_the_daemon_died_is_not_decided_twice(rig: Rig) -> None:
    hook = Halving()
    run_id, _ = _oom_then_die_while_probing(rig, hook)
    spec = {**rig.run(run_id)["spec"], "knobs": {"bs": 8}}
    rig.writer.call(
        lambda db: RunStore(db).add_retune(run_id, 1, {"bs": 16}, {"bs": 8}, "gpu_capacity", spec=spec)
    )
    rig.restart()
    assert hook.calls == []
    assert rig.run(run_id)["message"] == "retuned before a daemon restart; waiting to start"
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["spec"]["knobs"]["bs"] == 8


def test_an_attempt_spawned_but_not_recorded_is_found_by_its_tag_and_adopted(rig: Rig) -> None:
    run_id = rig.submit(command())
    spawn = rig.procs.spawn

    def spawn_then_die(*args: object, **kwargs: object) -> object:
        spawn(*args, **kwargs)  # type: ignore[arg-type]
        raise DaemonDied

    rig.procs.spawn = spawn_then_die  # type: ignore[method-assign,assignment]
    with pytest.raises(DaemonDied):
        rig.step()
    rig.procs.spawn = spawn  # type: ignore[method-assign]
    proc = rig.procs.last
    assert proc.env[RUN_TAG] == run_tag(run_id, 1)
    assert rig.attempts(run_id)[0]["pid"] is None  # the daemon died before recording it
    rig.restart()
    (attempt,) = rig.attempts(run_id)
    assert attempt["pid"] == proc.pid and attempt["adopted"] is True
    assert rig.state(run_id) == RunState.RUNNING and proc.signals == []
    proc.emit("finished", report={})
    proc.exit(0)
    rig.step()
    assert rig.state(run_id) == RunState.SUCCEEDED


def test_leftovers_of_this_daemon_runs_are_killed_and_other_processes_spared(rig: Rig) -> None:
    running, ended = rig.submit(command("running")), rig.submit(command("ended"))
    rig.step()
    proc = rig.proc_of(running)
    helper = rig.procs.start_probe(running, rig.paths.state_dir / "helper")  # the attempt's own business
    escaped = rig.procs.start_probe(ended, rig.paths.state_dir / "escaped")  # left its group, then
    rig.proc_of(ended).exit(0)  # its run ended
    rig.step()
    foreign = rig.procs.start_probe("r0123456789", rig.paths.state_dir / "foreign")  # another daemon's
    rig.restart()
    assert rig.sup.active[running].child.pid == proc.pid and proc.signals == []  # adopted, untouched
    assert helper.signals == [] and helper.running
    assert escaped.signals == [signal.SIGKILL] and not escaped.running
    assert foreign.signals == [] and foreign.running


def test_a_standby_a_previous_daemon_started_for_the_next_attempt_is_killed(rig: Rig) -> None:
    run_id = rig.submit(command("running"))
    rig.step()
    proc = rig.proc_of(run_id)
    folder = rig.paths.state_dir / "standby"
    folder.mkdir()
    standby = rig.procs.spawn(["python"], {RUN_TAG: run_tag(run_id, 2)}, None, folder / "o", folder / "e")
    rig.procs.spawned.pop()
    rig.restart()
    # Its orders came through the dead daemon's pipe: no later daemon can hand it the attempt.
    assert rig.procs.table[standby.pid].signals == [signal.SIGKILL]
    assert rig.sup.active[run_id].child.pid == proc.pid and proc.signals == []


def _die_before_the_run_moves_on(rig: Rig) -> None:
    """The daemon records the attempt's ending, then dies before the run's state follows it."""
    set_state = rig.sup.ctx.set_state

    def die(run_id: str, state: RunState, *args: object, **kwargs: object) -> None:
        if state != RunState.RUNNING:
            raise DaemonDied
        set_state(run_id, state, *args, **kwargs)  # type: ignore[arg-type]

    rig.sup.ctx.set_state = die  # type: ignore[method-assign]
    with pytest.raises(DaemonDied):
        rig.step()


def test_an_oom_recorded_just_before_the_daemon_died_is_retuned_not_interrupted(rig: Rig) -> None:
    hook = Halving()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("oom", verdict="gpu_capacity")
    proc.exit(EXIT_OOM)
    _die_before_the_run_moves_on(rig)
    assert rig.state(run_id) == RunState.RUNNING and rig.attempts(run_id)[0]["classification"] == "oom"
    rig.restart()
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.RUNNING and run["attempt"] == 2 and run["spec"]["knobs"]["bs"] == 8


def test_a_success_recorded_just_before_the_daemon_died_stays_a_success(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    proc.emit("finished", report={})
    proc.exit(0)
    _die_before_the_run_moves_on(rig)
    rig.restart()
    assert rig.state(run_id) == RunState.SUCCEEDED
