"""An attempt's end wakes the supervisor at once (the real watch: tests/daemon/test_exit_watch.py),
so a failed attempt's retune and a run's end do not wait for the next pass."""

from __future__ import annotations

from tests.supervise.conftest import Rig, command


def test_an_attempt_ending_wakes_the_supervisor_without_waiting_for_its_next_pass(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.sup.ctx.wakeup.clear()
    proc.exit(0)
    assert rig.sup.ctx.wakeup.is_set()
    rig.step()
    assert rig.state(run_id) == "succeeded"


def test_an_adopted_attempt_ending_wakes_the_supervisor_too(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    rig.restart()  # the daemon died and came back: the attempt is adopted
    rig.sup.ctx.wakeup.clear()
    proc.exit(0)
    assert rig.sup.ctx.wakeup.is_set()
