"""What the routers need from the daemon, and nothing more.

A narrow Protocol instead of the `Daemon` class: the routers do not import the daemon (no
app ↔ api circle), and a test can serve the API over anything that answers these calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Sized
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.paths import Paths
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.submission import Submission
from gpuwarden.core.telemetry.types import GpuProcess, GpuSample, GpuStatic, HostProcess, Tick
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.stream import Broadcaster

RunRow = Mapping[str, Any]  # a `runs` row as the store reads it


class RunControl(Protocol):
    """The supervisor's actions the API offers."""

    @property
    def active(self) -> Sized:
        """The attempts being watched now."""
        ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def submit(
        self,
        spec: RunSpec,
        submitted_text: str | None = None,
        *,
        label: str = ...,
        check_inputs: bool = ...,
        environment: Mapping[str, str] | None = ...,
        submission: Submission | None = ...,
    ) -> RunRow: ...

    def stop_run(self, run_id: str, grace: float | None = None) -> RunRow: ...

    def resume_run(self, run_id: str) -> RunRow: ...

    def tune_run(self, run_id: str) -> RunRow: ...

    def edit_run(self, run_id: str, changes: Mapping[str, Any]) -> RunRow: ...

    def delete_run(self, run_id: str) -> None: ...

    def pid_owners(self) -> dict[int, str]:
        """Process-group id → run id of every watched attempt."""
        ...

    def program_of(self, run_id: str) -> int | None:
        """The pid of the program the run's watched attempt runs, if any."""
        ...


class HeaviestProcesses(Protocol):
    """The host's heaviest processes (`gpuwarden.core.telemetry.top.TopReader`)."""

    def heaviest(self, count: int) -> list[HostProcess]:
        """The `count` busiest and the `count` largest in memory, busiest first."""
        ...


class DaemonView(Protocol):
    """The daemon's state and stores as the API reads them."""

    @property
    def uptime(self) -> float: ...

    @property
    def gpu_status(self) -> str: ...

    @property
    def paths(self) -> Paths: ...

    @property
    def latest_tick(self) -> Tick | None: ...

    @property
    def latest_processes(self) -> Sequence[GpuProcess]: ...

    @property
    def broadcaster(self) -> Broadcaster: ...

    @property
    def top(self) -> HeaviestProcesses: ...

    @property
    def storage(self) -> StorageHealth:
        """Whether the daemon can write its state; API handlers report what the disk refused."""
        ...

    @property
    def stopping(self) -> bool:
        """Shutdown has begun: long polls answer now instead of holding the daemon open."""
        ...

    @property
    def supervisor(self) -> RunControl: ...

    def gpu_snapshot(self) -> list[tuple[GpuStatic, GpuSample | None]]: ...

    def runs(self) -> RunStore:
        """Run queries on this thread's read-only connection."""
        ...

    def telemetry_reader(self) -> TelemetryStore: ...

    def request_shutdown(self) -> None: ...


async def _daemon_of(request: Request) -> DaemonView:
    daemon: DaemonView = request.app.state.daemon
    return daemon


# A handler parameter that receives the daemon the app was created for.
DaemonDep = Annotated[DaemonView, Depends(_daemon_of)]
