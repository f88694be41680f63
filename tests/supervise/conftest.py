"""A supervisor on a real store with a fake process layer, a fake clock and inline workers.

`rig.step()` is one pass of the loop; nothing sleeps and nothing depends on the machine's load.
`rig.restart()` is a daemon restart: a new supervisor on the same store and process table.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.paths import Paths
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.stream import Broadcaster
from gpuwarden.daemon.supervise import Backends, Hooks, Supervisor
from gpuwarden.daemon.supervise.backends import WarmStarts
from gpuwarden.daemon.writer import StoreWriter
from tests.supervise.fakes import FakeClock, FakeProcess, FakeProcesses, Workers

GIB = 1 << 30
HOST_MEMORY = 64 * GIB


class RecordingBroadcaster(Broadcaster):
    """The daemon's broadcaster, keeping every frame it was asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[str, dict[str, Any]]] = []

    def publish(self, kind: str, data: dict[str, Any], run_id: str | None = None) -> None:
        self.frames.append((kind, data))
        super().publish(kind, data, run_id)


class Rig:
    """One supervisor and everything it is given; helpers read the store as the API does."""

    def __init__(self, paths: Paths, writer: StoreWriter, gpus: list[GpuState]) -> None:
        self.paths = paths
        self.writer = writer
        self.gpus = gpus
        self.clock = FakeClock()
        self.procs = FakeProcesses(self.clock)
        self.workers = Workers()
        self.oom_kills: int | None = 0
        self.hooks = Hooks()
        self.settings = Settings()
        self.topology: GpuTopology = NO_TOPOLOGY
        self.broadcaster = RecordingBroadcaster()
        self.warm: WarmStarts | None = None  # no standbys unless a test gives them
        self.sup = self._supervisor()

    def _supervisor(self) -> Supervisor:
        backends = Backends(
            processes=self.procs,
            gpu_states=lambda: self.gpus,
            clock=self.clock,
            oom_kills=lambda: self.oom_kills,
            host_memory=lambda: HOST_MEMORY,
            start_thread=self.workers,
            topology=lambda: self.topology,
            warm=self.warm,
        )
        return Supervisor(self.settings, self.paths, self.writer, self.broadcaster, backends, self.hooks)

    def use(self, hooks: Hooks) -> None:
        """Swap the policies (before the first step)."""
        self.hooks = hooks
        self.sup = self._supervisor()

    def restart(self) -> None:
        """The daemon died and came back: a new supervisor adopts what the old one left."""
        self.sup = self._supervisor()
        with self.sup.lock:
            self.sup.adopt()

    # -- driving --------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any] | RunSpec, **kw: Any) -> str:
        parsed = spec if isinstance(spec, RunSpec) else spec_from_mapping(spec)
        return str(self.sup.submit(parsed, **kw)["id"])

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            with self.sup.lock:
                self.sup.step()

    def proc_of(self, run_id: str) -> FakeProcess:
        """The process of the run's current attempt."""
        pid = self.sup.active[run_id].child.pid
        return self.procs.table[pid]

    # -- reading ---------------------------------------------------------------------------------

    def run(self, run_id: str) -> dict[str, Any]:
        run = self.writer.call(lambda db: RunStore(db).get_run(run_id))
        assert run is not None
        return run

    def state(self, run_id: str) -> str:
        return str(self.run(run_id)["state"])

    def states(self, run_id: str) -> list[str]:
        return [e["state"] for e in self.events(run_id, "state")]

    def events(self, run_id: str, type_: str | None = None) -> list[dict[str, Any]]:
        events = self.writer.call(lambda db: RunStore(db).events(run_id, limit=100_000))
        return [e for e in events if type_ is None or e["type"] == type_]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return self.writer.call(lambda db: RunStore(db).attempts(run_id))

    def retunes(self, run_id: str) -> list[dict[str, Any]]:
        return self.writer.call(lambda db: RunStore(db).retunes(run_id))


def command(name: str = "job", **extra: Any) -> dict[str, Any]:
    """A command run spec (the program is never started: the process layer is fake)."""
    spec: dict[str, Any] = {
        "name": name,
        "kind": "command",
        "command": {"argv": [sys.executable, "-c", "pass", "{events_file}"]},
        "resources": {"gpus": 1},
    }
    spec.update(extra)
    return spec


def train(name: str = "tr", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "kind": "train",
        "resources": {"gpus": 1},
        "train": {"task": "image", "batch_size": 16, "grad_accum_steps": 1, "max_steps": 10},
    }
    spec.update(extra)
    return spec


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    paths = Paths(state_dir=tmp_path / "state", runtime_dir=tmp_path / "run", db=tmp_path / "state" / "t.db")
    paths.runs_dir.mkdir(parents=True)
    writer = StoreWriter(paths.db)
    writer.start()
    gpus = [GpuState("GPU-0", 0, 80 * GIB, 1 * GIB), GpuState("GPU-1", 1, 80 * GIB, 1 * GIB)]
    try:
        yield Rig(paths, writer, gpus)
    finally:
        writer.stop()
