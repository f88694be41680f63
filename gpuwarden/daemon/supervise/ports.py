"""What the supervisor needs from whoever hosts it: somewhere to write, and someone to tell.

The daemon hosts it with its store writer and the live stream's broadcaster; `gpuwarden exec`
hosts it inside a cluster job with a store in the run's own folder and its stdout. The parts
only see these two Protocols (and `Backends` for the machine), never the host's classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gpuwarden.core.store import sqlite_utils
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
