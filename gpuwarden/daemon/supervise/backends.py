"""What the supervisor reads from or does to the machine, behind interfaces tests substitute:
the process layer, the GPUs' state, the clock, the OOM-kill counter, the host's memory, threads.

`gpuwarden.daemon.daemon.local_backends` wires the real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.process import ExitStatus, Tagged


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
    ) -> ChildProcess:
        """Start `argv` in a session of its own; raises OSError when it cannot be started."""

    def adopt(self, pid: int, create_time: float) -> ChildProcess:
        """A handle on (pid, create time); its `poll()` says whether that process still runs."""

    def tagged(self) -> list[Tagged]:
        """The live processes started for runs (attempts, probes, and what those started)."""

    def kill(self, processes: Collection[Tagged]) -> None:
        """Kill the process groups of `processes` and wait until they are gone."""


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
