"""What the run commands read (`ps`, `show`, `logs`, `events`, `run --follow`): the daemon's API
client gives it, and so do run folders (`--runs DIR`); the commands are written against this."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuwarden.core.api import EventsPage, LogChunk, RunDetail, RunSummary


class LogReader(Protocol):
    """What printing a run's output reads: its attempts' stdout and stderr."""

    def logs(
        self,
        ref: str,
        stream: str = "stdout",
        attempt: int | None = None,
        offset: int | None = None,
        limit: int = 65536,
        wait: float = 0.0,
    ) -> LogChunk: ...


class RunReader(LogReader, Protocol):
    def runs(self, states: Sequence[str] = ()) -> list[RunSummary]: ...

    def run(self, ref: str) -> RunDetail: ...

    def events(self, ref: str, since: int = 0, limit: int = 1000, wait: float = 0.0) -> EventsPage: ...
