"""What the supervisor reads from or does to the machine, behind interfaces tests substitute:
the process layer, the GPUs' state and links, the clock, the OOM-kill counter, the host's memory,
threads.

`gpuwarden.daemon.wiring.local_backends` wires the real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwarden.core.gang.launch import NodeRole
from gpuwarden.core.gang.nodes import NodePlan
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import ExitStatus, Tagged
from gpuwarden.daemon.stack_dump import DumpTarget, StackDump
from gpuwarden.daemon.warm_start import WarmLaunch


class ChildProcess(Protocol):
    """An attempt's process, spawned by this daemon or re-adopted from a previous one."""

    @property
    def pid(self) -> int: ...

    @property
    def create_time(self) -> float: ...

    @property
    def adopted(self) -> bool: ...

    def poll(self) -> ExitStatus | None:
        """None while it runs, else how it ended (neither code nor signal when not our child)."""

    def group_alive(self) -> bool:
        """Whether any process of its process group remains."""

    def signal_group(self, sig: int) -> bool:
        """Send `sig` to its whole process group; False when none is left."""

    def signal_tree(self, sig: int) -> bool:
        """Send `sig` to its process group and to every group a descendant leads (torchrun's
        ranks run in sessions of their own); False when none is left."""


class ProcessLayer(Protocol):
    """Starting attempt processes and finding those a previous daemon started."""

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | None,
        stdout_path: Path,
        stderr_path: Path,
        memory_limit: int | None = None,
        scope_unit: str | None = None,
        exit_file: Path | None = None,
        umask: int | None = None,
    ) -> ChildProcess:
        """Start `argv` in a session of its own; raises OSError when it cannot be started. With
        `exit_file`, how it ended is written there, for a later daemon that is not its parent;
        `umask` is the program's (None: this process's)."""

    def adopt(self, pid: int, create_time: float) -> ChildProcess:
        """A handle on (pid, create time); its `poll()` says whether that process still runs."""

    def on_exit(self, child: ChildProcess, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) once `child`'s process has ended, or never where the
        machine cannot tell: the supervisor's passes see the end either way, this only sooner."""

    def tagged(self) -> list[Tagged]:
        """The live processes started for runs (attempts, probes, and what those started)."""

    def kill(self, processes: Collection[Tagged]) -> None:
        """Kill the process groups of `processes` and wait until they are gone."""

    def ranks(self, pid: int) -> dict[int, int]:
        """Rank → pid of the live ranks a torchrun process `pid` started (by their RANK)."""

    def program(self, pid: int) -> int:
        """The pid of the program an attempt's process `pid` runs: its child when `pid` is the
        exit-status recorder, else `pid`."""

    def dump_stacks(self, targets: Sequence[DumpTarget]) -> list[StackDump]:
        """The Python stacks of running processes, without stopping them (`stack_dump.py`)."""


class WarmStarts(Protocol):
    """Standbys: the next attempt of a user's Python script, its libraries imported while the
    current one runs (`daemon/warm_start.py`)."""

    def prepare(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        folder: Path,
        exit_file: Path,
        scope_unit: str | None = None,
    ) -> None:
        """Start the standby that may become the run's `attempt`; OSError when it cannot start."""

    def take(
        self,
        run_id: str,
        attempt: int,
        launch: WarmLaunch,
        outputs: tuple[Path, Path],
        may_differ: Collection[str],
    ) -> ChildProcess | None:
        """The run's standby, handed `launch` as its `attempt` (stdout and stderr to `outputs`);
        None when it has none that can become it."""

    def discard(self, run_id: str) -> None:
        """End the run's standby, if it has one."""

    def close(self) -> None:
        """Let every standby go (the daemon stops)."""


class OtherMachines(Protocol):
    """The machines a run over several (`resources.nodes` > 1) also runs on, as the first one's
    supervisor reaches them: only `gpuwarden exec` on a cluster job's first node has them."""

    @property
    def count(self) -> int:
        """The run's machines, this one included."""

    def rendezvous(self, run_id: str, attempt: int) -> NodeRole:
        """Where the attempt's ranks meet (on this machine), as this machine's torchrun joins."""

    def publish(self, plan: NodePlan, attempt_dir: Path) -> None:
        """Have the other machines start their part of the attempt."""

    def watch(self, child: ChildProcess, attempt_dir: Path) -> ChildProcess:
        """The attempt as one process: this machine's torchrun and the others' together (it ends
        when all have; a signal to it reaches them all)."""


def _no_topology() -> GpuTopology:
    return NO_TOPOLOGY


def _thread(name: str, target: Callable[[], None]) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


@dataclass(frozen=True)
class Backends:
    """Everything the supervisor reads from or does to the machine; tests substitute fakes."""

    processes: ProcessLayer
    gpu_states: Callable[[], list[GpuState]]
    clock: Callable[[], float]
    oom_kills: Callable[[], int | None]  # the cgroup's OOM-kill counter, None when unreadable
    host_memory: Callable[[], int]  # the machine's memory in bytes
    # Runs slow work (probes) off the loop: a daemon thread, or inline in tests.
    start_thread: Callable[[str, Callable[[], None]], None] = _thread
    # How the GPUs are linked (the sampler's NVML topology), for placing multi-GPU runs.
    topology: Callable[[], GpuTopology] = _no_topology
    # A run's other machines (see OtherMachines); None where runs live on this machine alone.
    machines: OtherMachines | None = None
    # The umask a user's own program (a command run) writes its files with: the user's, where
    # the host keeps its own files owner-only; None: the host's.
    user_umask: int | None = None
    # Standbys for restarts of users' Python scripts; None: every attempt starts cold.
    warm: WarmStarts | None = None
