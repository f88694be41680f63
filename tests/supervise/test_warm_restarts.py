"""The supervisor's side of warm restarts, with a fake standby layer over the fake processes:
which runs get a standby and for which attempt, when an attempt is handed to it, and that one
that starts cold never finds a record its discarded standby left."""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.command.record import read_record
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.process import RUN_TAG
from gpuwarden.daemon.supervise import Hooks
from gpuwarden.daemon.supervise.backends import ChildProcess
from gpuwarden.daemon.supervise.spawner import warm_wanted
from gpuwarden.daemon.warm_start import WarmLaunch, differences
from tests.supervise.conftest import Rig
from tests.supervise.test_retune import Halving, _oom

WARM = "started warm: its libraries were imported while the last attempt ran"


@dataclass
class Prepared:
    run_id: str
    attempt: int
    launch: WarmLaunch
    exit_file: Path
    scope_unit: str | None
    child: ChildProcess


@dataclass
class FakeWarm:
    """Standbys as fake processes; `stale_exit`: what a discarded standby's recorder writes."""

    rig: Rig
    prepared: list[Prepared] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    stale_exit: bool = False

    def prepare(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        folder: Path,
        exit_file: Path,
        scope_unit: str | None = None,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        child = self.rig.procs.spawn(
            ["standby"], launch.env, launch.cwd, folder / "o", folder / "e", exit_file=exit_file
        )
        self.prepared.append(Prepared(run_id, attempt, launch, exit_file, scope_unit, child))

    def take(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        outputs: tuple[Path, Path],
        may_differ: Collection[str],
    ) -> ChildProcess | None:
        mine = [p for p in self.prepared if p.run_id == run_id]
        if not mine:
            return None
        last = mine[-1]
        if last.attempt == attempt and not differences(last.launch, launch, may_differ):
            return last.child
        if self.stale_exit:
            last.exit_file.parent.mkdir(parents=True, exist_ok=True)
            last.exit_file.write_text('{"signal": 9}')
        self.discarded.append(run_id)
        return None

    def discard(self, run_id: str) -> None:
        self.discarded.append(run_id)

    def close(self) -> None:
        return None


@pytest.fixture
def warm(rig: Rig) -> FakeWarm:
    fake = FakeWarm(rig)
    rig.warm = fake
    rig.use(Hooks(retune=Halving()))
    return fake


def _script(name: str = "job", **command: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "command",
        "command": {"argv": [sys.executable, "train.py", "--bs", "{bs}"], "warm_restart": True, **command},
        "knobs": {"bs": 16},
        "resources": {"gpus": 1},
    }


def test_a_scripts_next_attempt_waits_beside_it_and_is_handed_the_restart(rig: Rig, warm: FakeWarm) -> None:
    run_id = rig.submit(_script())
    rig.step()
    (standby,) = warm.prepared
    assert (standby.run_id, standby.attempt) == (run_id, 2)
    assert standby.launch.env[RUN_TAG] == f"{run_id}/2"  # it is attempt 2 from the start
    run_dir = Path(rig.run(run_id)["run_dir"])
    assert standby.exit_file == run_dir / "attempts" / "2" / "exit.json"
    assert standby.scope_unit == f"gpuwarden-run-{run_id}-2-warm"
    _oom(rig, run_id)
    rig.step(3)
    assert rig.run(run_id)["attempt"] == 2
    assert rig.sup.active[run_id].child is standby.child
    assert rig.run(run_id)["message"] == f"attempt 2: {WARM}"
    warm_record, cold_record = read_record(run_dir, 2), read_record(run_dir, 1)
    assert warm_record is not None and warm_record.started_warm
    assert cold_record is not None and not cold_record.started_warm
    assert [(p.attempt, p.launch.argv[-1]) for p in warm.prepared] == [(2, "16"), (3, "8")]
    rig.proc_of(run_id).exit(0)
    rig.step()
    assert rig.state(run_id) == RunState.SUCCEEDED
    assert warm.discarded == [run_id]  # the standby for attempt 3: no attempt comes after


def test_an_attempt_that_starts_cold_finds_no_record_of_the_standby_it_replaced(
    rig: Rig, warm: FakeWarm
) -> None:
    warm.stale_exit = True
    run_id = rig.submit(_script(env={"HF_HOME": "{bs}"}))  # read as transformers is imported
    rig.step()
    _oom(rig, run_id)
    rig.step(3)
    assert warm.discarded == [run_id]
    assert rig.run(run_id)["message"] == "attempt 2: started"
    attempt = rig.sup.active[run_id]
    assert attempt.child is not warm.prepared[0].child
    assert not attempt.exit_file.exists()  # the killed standby's recorder wrote one; it is gone


@pytest.mark.parametrize(
    "command",
    [
        {"warm_restart": False},
        {"argv": [sys.executable, "-u", "train.py"]},  # interpreter options: started cold
        {"argv": ["bash", "-c", "python train.py --bs {bs}"]},
        {"launcher": "torchrun"},
    ],
)
def test_no_standby_where_it_is_off_or_the_program_is_not_a_plain_python_script(
    rig: Rig, warm: FakeWarm, command: dict[str, Any]
) -> None:
    rig.submit(_script(**command))
    rig.step()
    assert warm.prepared == []


@pytest.mark.parametrize(
    ("setting", "cpus", "wanted"),
    [(True, 1, True), (False, 64, False), ("auto", 2, False), ("auto", 3, False), ("auto", 4, True)],
)
def test_restarts_start_warm_as_the_spec_says_or_on_four_cpus_or_more(
    setting: bool | str, cpus: int, wanted: bool
) -> None:
    assert warm_wanted(setting, cpus) is wanted  # type: ignore[arg-type]
