"""A daemon bug met while doing one run's work fails that run, with one line saying why, and the
loop goes on with every other run."""

from __future__ import annotations

import errno
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import AttemptEnd, Hooks, NextAttempt, RetuneNotes
from tests.supervise.conftest import Rig, command
from tests.supervise.fakes import FakeClock
from tests.supervise.test_retune import Halving

BUG = "the daemon failed while supervising the run"
SUPERVISOR_LOG = "gpuwarden.daemon.supervisor"


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == SUPERVISOR_LOG and r.levelno >= logging.ERROR]


def test_runs_whose_process_cannot_be_read_fail_alone_and_the_bug_is_logged_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    bad, worse, good = (rig.submit(command(name, resources={"gpus": 0})) for name in ("bad", "worse", "good"))
    rig.step()
    procs = {run_id: rig.proc_of(run_id) for run_id in (bad, worse, good)}
    for run_id in (bad, worse):
        procs[run_id].unreadable = PermissionError(errno.EPERM, "Operation not permitted")
    procs[good].exit(0)
    with caplog.at_level(logging.INFO, logger=SUPERVISOR_LOG):
        rig.step(4)
    assert rig.state(good) == RunState.SUCCEEDED
    for run_id in (bad, worse):
        run = rig.run(run_id)
        assert run["state"] == RunState.FAILED
        assert run["message"] == (
            f"attempt 1: {BUG} (PermissionError: [Errno 1] Operation not permitted; a daemon bug, see its"
            " log); its processes were killed"
        )
        assert rig.events(run_id, "state")[-1]["message"] == run["message"]
        (attempt,) = rig.attempts(run_id)
        assert (attempt["state"], attempt["classification"]) == ("ended", "failed")
        assert attempt["ended_at"] == run["ended_at"] == rig.clock()
        assert procs[run_id].signals == [signal.SIGKILL] and not procs[run_id].group_alive
    assert rig.sup.active == {}
    # One line per run, the traceback with the first only (the same bug), nothing on later passes.
    errors = _errors(caplog)
    assert [bad in e.getMessage() for e in errors] == [True, False]
    assert [worse in e.getMessage() for e in errors] == [False, True]
    assert [e.exc_info is not None for e in errors] == [True, False]


class UnstorableFor:
    """Halves `bs`, but for one run its evidence holds what JSON cannot carry: a decision the
    store cannot record."""

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name
        self.halving = Halving()

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes,
    ) -> NextAttempt | None:
        decision = self.halving(run, end, events, notes)
        assert decision is not None
        return replace(decision, evidence={"tried": {16, 8}}) if run["name"] == self.run_name else decision


def test_a_completion_that_raises_fails_its_run_and_the_next_one_is_still_applied(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.use(Hooks(retune=UnstorableFor("bad")))
    bad, good = rig.submit(command("bad", knobs={"bs": 16})), rig.submit(command("good", knobs={"bs": 16}))
    rig.step()
    for run_id in (bad, good):  # both out of memory in one pass: both retunes handed back in order
        rig.proc_of(run_id).emit("oom", verdict="gpu_capacity")
        rig.proc_of(run_id).exit(EXIT_OOM)
    rig.step()
    assert rig.state(bad) == rig.state(good) == RunState.RETUNING
    with caplog.at_level(logging.INFO, logger=SUPERVISOR_LOG):
        rig.step(2)
    good_run = rig.run(good)
    assert good_run["state"] == RunState.RUNNING and good_run["attempt"] == 2
    assert good_run["spec"]["knobs"]["bs"] == 8
    bad_run = rig.run(bad)
    assert bad_run["state"] == RunState.FAILED and bad_run["attempt"] == 1
    assert bad_run["message"] == (
        f"{BUG} (TypeError: Object of type set is not JSON serializable; a daemon bug, see its log)"
    )
    assert rig.retunes(bad) == [] and bad not in rig.sup.ctx.held
    assert len(_errors(caplog)) == 1


def test_a_run_whose_stored_spec_no_longer_validates_fails_and_the_run_behind_it_starts(rig: Rig) -> None:
    bad = rig.submit(command("bad"))
    # Queued by an older gpuwarden, which let a NUL into argv: no program can be given one.
    rig.writer.call(
        lambda db: db.conn.execute(
            "UPDATE runs SET spec = json_set(spec, '$.command.argv[2]', 'a' || char(0) || 'b') WHERE id = ?",
            (bad,),
        )
    )
    good = rig.submit(command("good"))
    rig.step()
    assert rig.state(good) == RunState.RUNNING
    run = rig.run(bad)
    assert run["state"] == RunState.FAILED
    assert "argv[2]: holds a NUL character" in run["message"] and "\n" not in run["message"]
    assert rig.attempts(bad) == []
    assert rig.states(bad) == ["queued", "failed"]


def test_a_queued_run_pinned_to_a_gpu_that_is_gone_fails_and_the_queue_moves_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    pinned = rig.submit(command("pinned", resources={"gpus": ["1"]}))
    rig.gpus = rig.gpus[:1]  # e.g. the daemon restarted on a machine with one card fewer
    behind = rig.submit(command("behind"))
    with caplog.at_level(logging.INFO, logger=SUPERVISOR_LOG):
        rig.step(2)
    assert rig.state(behind) == RunState.RUNNING
    run = rig.run(pinned)
    assert run["state"] == RunState.FAILED and run["attempt"] == 0
    assert run["message"] == "resources.gpus: no single GPU matches '1' — GPUs here: 0=GPU-0"
    # What the user can fix is no daemon bug: one warning, no traceback.
    (said,) = [r for r in caplog.records if r.name == SUPERVISOR_LOG and r.levelno >= logging.WARNING]
    assert said.levelno == logging.WARNING and said.exc_info is None and pinned in said.getMessage()


class CountingClock(FakeClock):
    """A fake clock that says when it has been read `enough` times since `count_from_now` (the
    loop reads it twice a pass)."""

    def __init__(self, enough: int) -> None:
        super().__init__()
        self.reads = 0
        self.enough = enough
        self.reached = threading.Event()

    def count_from_now(self) -> None:
        self.reads = 0
        self.reached.clear()

    def __call__(self) -> float:
        self.reads += 1
        if self.reads >= self.enough:
            self.reached.set()
        return super().__call__()


def test_a_pass_that_fails_outside_any_run_logs_its_traceback_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    clock = CountingClock(enough=8)
    rig.clock = clock
    rig.use(rig.hooks)
    with caplog.at_level(logging.INFO, logger=SUPERVISOR_LOG):
        rig.sup.start()
        try:
            # A table the pass reads before any run's work is gone: every pass fails from here on.
            rig.writer.call(lambda db: db.conn.execute("ALTER TABLE runs RENAME TO runs_elsewhere"))
            clock.count_from_now()
            assert clock.reached.wait(timeout=60), "the loop stopped making passes"
        finally:
            rig.sup.stop()
    (error,) = _errors(caplog)
    assert error.getMessage() == "supervisor pass failed; retrying" and error.exc_info is not None


def test_a_full_database_fails_no_run_and_the_run_goes_on_once_there_is_room(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    pages = rig.writer.call(lambda db: db.execute("PRAGMA page_count").fetchone()[0])
    rig.writer.call(lambda db: db.execute(f"PRAGMA max_page_count = {pages}"))  # no page more
    proc = rig.proc_of(run_id)
    proc.emit("progress", step=1, loss=0.5, note="x" * 50_000)
    rig.step(2)
    assert rig.state(run_id) == RunState.RUNNING and run_id in rig.sup.active
    assert rig.events(run_id, "progress") == []
    rig.writer.call(lambda db: db.execute(f"PRAGMA max_page_count = {pages * 1000}"))
    proc.exit(0)
    rig.step()
    assert rig.state(run_id) == RunState.SUCCEEDED
    assert [e["loss"] for e in rig.events(run_id, "progress")] == [0.5]  # stored once, none lost
