"""What the supervisor needs from whoever hosts it: somewhere to write, someone to tell, and
someone to read the GPUs' energy counters as attempts start and end.

The daemon hosts it with its store writer, the live stream's broadcaster and its sampler;
`gpuwarden exec` hosts it inside a cluster job with a store in the run's own folder, its stdout
and its own sampler. The parts only see these Protocols (and `Backends` for the machine), never
the host's classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.attempt_energy import Edge
from gpuwarden.daemon.storage_health import StorageHealth

T = TypeVar("T")


class Store(Protocol):
    """The one connection that writes the run store, owned by a thread of its own: `call` runs a
    job there and waits for it (committed when it returns); `health` hears of refused writes."""

    @property
    def health(self) -> StorageHealth: ...

    def call(self, job: Callable[[sqlite_utils.Database], T], timeout: float = 30.0) -> T: ...


class Publisher(Protocol):
    """Where the supervisor tells what happened (a run's new state, an event) as it happens."""

    def publish(self, kind: str, data: dict[str, Any], run_id: str | None = None) -> None: ...


class EnergyReadings(Protocol):
    """Reads the energy counters of an attempt's GPUs at the moment it starts or ends and stores
    them with the attempt: its energy is then their difference, however short it was next to the
    sampling interval. The host's sampler does it, on the GPU reader it already holds."""

    def read_energy(self, run_id: str, attempt: int, gpus: Sequence[str], edge: Edge) -> None: ...


class NoEnergyReadings:
    """A host without a sampler (tests): attempts' energy comes from the samples alone."""

    def read_energy(self, run_id: str, attempt: int, gpus: Sequence[str], edge: Edge) -> None:
        """Nothing to read."""
