"""The machines of a run over several, case by case with a fake process table: what node 0
publishes and how it waits for the others, and what another machine's exec does with the plan,
the leader's signals, its heartbeat and its silence. `test_exec_nodes.py` runs two real execs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.core.exit_record import read_status
from gpuwarden.core.gang.launch import NodeRole, gang_launch, runner_program
from gpuwarden.core.gang.nodes import (
    LeaderBeat,
    NodePlan,
    PlannedProgram,
    node_exit_path,
    read_plan,
    read_signal,
    write_whole,
)
from gpuwarden.job import exit_codes
from gpuwarden.job import follower as follower_module
from gpuwarden.job.follower import NodeFollower
from gpuwarden.job.leader import OTHERS_END_S, OTHERS_KILL_S, OTHERS_TERM_S, LeaderMachines
from tests.daemon.conftest import wait_for
from tests.supervise.fakes import FakeClock, FakeProcesses

TRAIN: dict[str, Any] = {
    "name": "two-machines",
    "kind": "train",
    "resources": {"gpus": 0, "nodes": 2},
    "train": {"task": "image", "world_size": 4, "batch_size": 2},
}


def _plan(leader: str, attempt: int, cpu_ranks: bool = True) -> NodePlan:
    return NodePlan(
        leader=leader,
        attempt=attempt,
        nodes=2,
        ranks_per_node=2,
        endpoint="node0:29500",
        rendezvous_id=f"r1-{attempt}",
        program=PlannedProgram(
            target="gpuwarden.runners", args=["--attempt", str(attempt)], python="/x/python", module=True
        ),
        leader_python="/x/python",
        env={"OMP_NUM_THREADS": "3", "SPEC_VAR": "1"},
        cwd="/tmp",
        memory_limit=1 << 30,
        cpu_ranks=cpu_ranks,
        run_id="r1",
    )


def test_a_machine_of_several_starts_its_own_ranks_and_meets_the_others_on_the_first() -> None:
    spec = spec_from_mapping(TRAIN)
    role = NodeRole(2, 1, "10.0.0.1:29500", "r1-3")
    program = runner_program("/x/python", Path("/run/resolved.yaml"), Path("/run"), 3)
    launch = gang_launch(
        spec, program, [], attempt_dir=Path("/run/attempts/3"), python="/x/python", cpu_count=8, node=role
    )
    argv = launch.argv
    assert launch.world_size == 4 and argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500" and "--standalone" not in argv
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=false"
    assert argv[argv.index("--log-dir") + 1] == "/run/attempts/3/ranks-node1"
    assert launch.env["TORCHELASTIC_ERROR_FILE"] == "/run/attempts/3/torchrun-error.node1.json"
    assert launch.env["OMP_NUM_THREADS"] == "4"  # the machine's CPUs over its two ranks


@pytest.mark.parametrize(
    ("resources", "train", "words"),
    [
        ({"gpus": 0, "nodes": 2}, {"world_size": 3}, "does not share out over resources.nodes 2"),
        ({"gpus": 4, "nodes": 2}, {"world_size": 4}, "starts 2 processes on each of 2 machines"),
        ({"gpus": 0, "nodes": 0}, {"world_size": 2}, "greater than or equal to 1"),
    ],
)
def test_machines_that_cannot_share_the_ranks_are_refused(
    resources: dict[str, int], train: dict[str, int], words: str
) -> None:
    document = {**TRAIN, "resources": resources, "train": {**TRAIN["train"], **train}}
    with pytest.raises((ConfigError, UserError)) as caught:
        spec_from_mapping(document)
    assert words in str(caught.value)


def test_gpus_default_to_the_ranks_of_one_machine() -> None:
    spec = spec_from_mapping({**TRAIN, "resources": {"nodes": 2}})
    assert spec.resources.gpus == 2


# -- node 0 ---------------------------------------------------------------------------------------


def test_node_0_publishes_each_attempt_and_waits_for_every_machine(tmp_path: Path) -> None:
    clock = FakeClock()
    processes = FakeProcesses(clock)
    machines = LeaderMachines(tmp_path, 2, "127.0.0.1", clock=clock)
    attempt_dir = tmp_path / "attempts" / "1"
    role = machines.rendezvous("r1", 1)
    assert role.endpoint.startswith("127.0.0.1:") and role.rendezvous_id == "r1-1"
    machines.publish(_plan("", 1), attempt_dir)
    plan = read_plan(attempt_dir)
    assert plan is not None and plan.leader == machines.token  # a plan names its leader

    local = processes.spawn(["torchrun"], {}, None, tmp_path / "o", tmp_path / "e", exit_file=tmp_path / "x")
    child = machines.watch(local, attempt_dir)
    child.signal_group(signal.SIGTERM)
    assert read_signal(attempt_dir) == "SIGTERM" and processes.last.signals == [signal.SIGTERM]
    assert processes.last.status is not None  # SIGTERM ended this machine's torchrun…
    assert child.poll() is None  # …but the other machine has not said it ended
    write_whole(node_exit_path(attempt_dir, 1), '{"code": 0}')
    assert child.poll() is not None


def test_node_0_stops_then_gives_up_on_a_machine_that_never_ends(tmp_path: Path) -> None:
    clock = FakeClock()
    processes = FakeProcesses(clock)
    machines = LeaderMachines(tmp_path, 2, "127.0.0.1", clock=clock)
    attempt_dir = tmp_path / "attempts" / "1"
    machines.publish(_plan("", 1), attempt_dir)
    child = machines.watch(
        processes.spawn(["torchrun"], {}, None, tmp_path / "o", tmp_path / "e"), attempt_dir
    )
    processes.last.exit(0)  # this machine's ranks finished
    assert child.poll() is None and read_signal(attempt_dir) is None  # the others end by themselves first
    clock.advance(OTHERS_END_S)
    assert child.poll() is None and read_signal(attempt_dir) == "SIGTERM"
    clock.advance(OTHERS_TERM_S)
    assert child.poll() is None and read_signal(attempt_dir) == "SIGKILL"
    clock.advance(OTHERS_KILL_S)
    status = child.poll()
    assert status is not None and status.code == 0


# -- the other machines ---------------------------------------------------------------------------


class Follower:
    """A follower on its own thread, its lines kept."""

    def __init__(self, run_dir: Path, clock: FakeClock) -> None:
        self.processes = FakeProcesses(clock)
        self.lines: list[str] = []
        self.follower = NodeFollower(
            run_dir, 1, self.processes, self.lines.append, environ={"PATH": "/bin", "RANK": "7"}, clock=clock
        )
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(self.follower.run()), daemon=True)

    def wait(self, what: str, done: Callable[[], object]) -> None:
        wait_for(done, what, timeout=30)


def _beat(run_dir: Path, token: str, beat: int, exit_code: int | None = None) -> None:
    write_whole(
        run_dir / "nodes" / "leader.json",
        LeaderBeat(token=token, beat=beat, run_id="r1", exit_code=exit_code).model_dump_json(),
    )


def test_another_machine_starts_its_part_passes_signals_on_and_ends_as_the_run(tmp_path: Path) -> None:
    clock = FakeClock()
    _beat(tmp_path, "old-leader", 5, exit_code=0)  # an earlier job's leader: not followed
    write_whole(tmp_path / "attempts" / "1" / "nodes.json", _plan("old-leader", 1).model_dump_json())
    node = Follower(tmp_path, clock)
    node.thread.start()
    node.wait("the follower waiting", lambda: node.lines)
    _beat(tmp_path, "L", 1)
    node.wait("the follower following", lambda: any("following run r1" in line for line in node.lines))
    assert node.processes.spawned == []  # the old leader's plan is not started
    attempt_dir = tmp_path / "attempts" / "2"
    write_whole(attempt_dir / "nodes.json", _plan("L", 2).model_dump_json())
    node.wait("its part started", lambda: node.processes.spawned)
    part = node.processes.last
    argv = part.argv
    assert argv[0] != "/x/python" and argv[argv.index("--node-rank") + 1] == "1"  # this machine's python
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node0:29500"
    assert part.env["CUDA_VISIBLE_DEVICES"] == "" and part.env["SPEC_VAR"] == "1" and "RANK" not in part.env
    assert part.env["OMP_NUM_THREADS"] == "3" and part.memory_limit == 1 << 30
    assert part.exit_file == node_exit_path(attempt_dir, 1)

    write_whole(attempt_dir / "nodes.signal", "SIGTERM")
    node.wait("the leader's SIGTERM passed on", lambda: part.signals == [signal.SIGTERM])
    node.wait("its part seen ended", lambda: any("attempt 2 ended" in line for line in node.lines))
    _beat(tmp_path, "L", 2, exit_code=exit_codes.RESTART)
    node.thread.join(timeout=30)
    assert node.code == [exit_codes.RESTART]  # the run's own code


def test_another_machine_stops_its_part_when_the_leader_falls_silent(tmp_path: Path) -> None:
    clock = FakeClock()
    node = Follower(tmp_path, clock)
    node.processes.ignores_sigterm = True
    node.thread.start()
    node.wait("the follower waiting", lambda: node.lines)  # a beat it saw first is not news
    _beat(tmp_path, "L", 1)
    write_whole(tmp_path / "attempts" / "1" / "nodes.json", _plan("L", 1, cpu_ranks=False).model_dump_json())
    node.wait("its part started", lambda: node.processes.spawned)
    part = node.processes.last
    assert "CUDA_VISIBLE_DEVICES" not in part.env  # GPU ranks use the GPUs this machine's job gives
    clock.advance(follower_module.LEADER_SILENCE_S + 1)
    node.wait("its part stopped", lambda: signal.SIGTERM in part.signals)
    clock.advance(follower_module.STOP_GRACE_S + 1)
    node.thread.join(timeout=30)
    assert node.code == [exit_codes.RESTART] and signal.SIGKILL in part.signals


def test_another_machine_records_its_part_killed_with_its_recorder(tmp_path: Path) -> None:
    """The leader's SIGKILL (after its grace) takes this machine's exit recorder with the part:
    the exec, the recorder's parent, writes how the part ended, so node 0 ends the attempt now
    rather than after its bound."""
    clock = FakeClock()
    node = Follower(tmp_path, clock)
    node.processes.ignores_sigterm = True
    node.thread.start()
    node.wait("the follower waiting", lambda: node.lines)
    _beat(tmp_path, "L", 1)
    attempt_dir = tmp_path / "attempts" / "1"
    write_whole(attempt_dir / "nodes.json", _plan("L", 1).model_dump_json())
    node.wait("its part started", lambda: node.processes.spawned)
    write_whole(attempt_dir / "nodes.signal", "SIGKILL")
    exit_file = node_exit_path(attempt_dir, 1)
    node.wait("its end recorded", exit_file.is_file)
    assert read_status(str(exit_file)) == (None, signal.SIGKILL)
    _beat(tmp_path, "L", 2, exit_code=exit_codes.SUCCEEDED)
    node.thread.join(timeout=30)
    assert node.code == [exit_codes.SUCCEEDED]
