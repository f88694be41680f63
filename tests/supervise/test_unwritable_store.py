"""The store refuses writes (its files made immutable with a real `chattr +i`) while attempts
run: what happens meanwhile is not lost, nor recorded twice, nor half recorded; it is recorded,
in order, once the store takes writes again, and the loop never fails with a traceback."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command
from tests.supervise.test_retune import Halving, _oom


class Frozen:
    """The rig's database and its write-ahead log made immutable (even to root), until `thaw`."""

    def __init__(self, rig: Rig) -> None:
        self.files = [rig.paths.db, rig.paths.db.with_name(rig.paths.db.name + "-wal")]
        self.on = False

    def freeze(self) -> None:
        subprocess.run(["chattr", "+i", *map(str, self.files)], check=True)
        self.on = True

    def thaw(self) -> None:
        subprocess.run(["chattr", "-i", *map(str, self.files)], check=True)
        self.on = False


@pytest.fixture
def frozen(rig: Rig, tmp_path: Path) -> Iterator[Frozen]:
    probe = tmp_path / "probe"
    probe.touch()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)]).returncode:
        pytest.skip("needs chattr +i (root, on a filesystem with the immutable flag: ext4, xfs, btrfs)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    rig.step()  # the store has written (its -wal file exists)
    store = Frozen(rig)
    try:
        yield store
    finally:
        if store.on:
            store.thaw()


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield
    bugs = [r for r in caplog.records if r.exc_info is not None]
    assert not bugs, [r.getMessage() for r in bugs]


pytestmark = pytest.mark.usefixtures("no_tracebacks")


def test_an_oom_while_the_store_refuses_writes_is_retuned_once_it_takes_them(
    rig: Rig, frozen: Frozen
) -> None:
    hook = Halving()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    frozen.freeze()
    _oom(rig, run_id)
    rig.clock.advance(5)
    ended_at = rig.clock()
    rig.step()
    rig.clock.advance(60)
    rig.step(3)
    assert rig.state(run_id) == RunState.RUNNING and hook.calls == [], "nothing decided unrecorded"
    assert rig.sup.unsettled == 0 and run_id in rig.sup.active

    frozen.thaw()
    rig.step()  # the end recorded, the retune decided (inline)
    rig.step()  # the decision applied: the next attempt starts
    run = rig.run(run_id)
    assert run["state"] == RunState.RUNNING and run["attempt"] == 2 and run["spec"]["knobs"]["bs"] == 8
    assert [r["to"] for r in rig.retunes(run_id)] == [{"bs": 8}]
    assert [e["type"] for e in rig.events(run_id) if e["type"] == "oom"] == ["oom"]
    assert rig.attempts(run_id)[0]["ended_at"] == ended_at, "its end when it ended, not when recorded"


def test_a_retune_decided_while_the_store_refuses_writes_is_recorded_once(rig: Rig, frozen: Frozen) -> None:
    rig.use(Hooks(retune=Halving()))
    rig.workers.hold = True
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    assert rig.state(run_id) == RunState.RETUNING
    frozen.freeze()
    rig.workers.release()  # the decision comes back while nothing can be written
    rig.step(3)
    assert rig.retunes(run_id) == [] and rig.state(run_id) == RunState.RETUNING
    assert rig.sup.ctx.held == {run_id: ["GPU-0"]}, "its GPU stays held for it"

    frozen.thaw()
    rig.step()
    assert len(rig.retunes(run_id)) == 1 and len(rig.events(run_id, "retuned")) == 1
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == 2
    assert rig.sup.ctx.held == {} and rig.sup.unsettled == 0


def test_a_restart_while_the_store_refuses_writes_is_counted_once(rig: Rig, frozen: Frozen) -> None:
    run_id = rig.submit(command(restart={"on": ["signal"], "max": 2, "backoff": 0}))
    rig.step()
    frozen.freeze()
    rig.proc_of(run_id).exit(sig=signal.SIGKILL)
    rig.step(3)
    assert rig.events(run_id, "restart") == [] and len(rig.procs.spawned) == 1

    frozen.thaw()
    rig.step(2)
    assert [e["restart"] for e in rig.events(run_id, "restart")] == [1]
    assert rig.state(run_id) == RunState.RUNNING and len(rig.procs.spawned) == 2


def test_a_process_started_as_the_store_stops_taking_writes_is_watched_and_recorded(
    rig: Rig, frozen: Frozen, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawn = rig.procs.spawn

    def spawn_then_freeze(*args: Any, **kwargs: Any) -> Any:
        child = spawn(*args, **kwargs)
        frozen.freeze()  # between the attempt's record and its pid's
        return child

    monkeypatch.setattr(rig.procs, "spawn", spawn_then_freeze)
    run_id = rig.submit(command())
    rig.step()
    assert rig.state(run_id) == RunState.STARTING and run_id in rig.sup.active
    rig.proc_of(run_id).emit("progress", step=1)
    rig.proc_of(run_id).exit(0)
    rig.step(3)
    assert rig.state(run_id) == RunState.STARTING and rig.sup.unsettled == 1

    frozen.thaw()
    rig.step()
    assert rig.states(run_id) == ["queued", "starting", "running", "succeeded"]
    (attempt,) = rig.attempts(run_id)
    assert attempt["pid"] == rig.procs.last.pid and attempt["exit_code"] == 0
    assert [e["step"] for e in rig.events(run_id, "progress")] == [1]


def test_a_stop_the_store_refuses_changes_nothing(rig: Rig, frozen: Frozen) -> None:
    run_id = rig.submit(command())
    rig.step()
    frozen.freeze()
    with pytest.raises(sqlite3.OperationalError):
        rig.sup.stop_run(run_id)
    assert rig.proc_of(run_id).signals == [] and not rig.sup.active[run_id].stop_requested
    assert rig.sup.ctx.health.fault is not None

    frozen.thaw()
    rig.sup.stop_run(run_id)
    rig.step()
    assert rig.state(run_id) == RunState.STOPPED
    assert rig.sup.ctx.health.fault is None


def test_a_note_the_store_refuses_costs_the_retune_nothing(rig: Rig, frozen: Frozen) -> None:
    rig.use(Hooks(retune=Halving(said=["probe 1 of 2: micro-batch 4 starting"])))
    rig.workers.hold = True
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    frozen.freeze()
    rig.workers.release()  # the policy's note is refused; its decision still comes back
    frozen.thaw()
    rig.step()
    assert rig.events(run_id, "probe") == [], "dropped, not recorded late"
    assert [r["to"] for r in rig.retunes(run_id)] == [{"bs": 8}]
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == 2
