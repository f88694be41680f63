"""Long polls that wait on the event loop, never on a worker thread.

A waiting request subscribes a watcher to the broadcaster for its run, so it wakes as soon as
the supervisor publishes a state change or an event; it also looks again every `recheck`
seconds for what nobody announces (a log file growing, a run deleted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuwarden.daemon.stream import Broadcaster, StreamClient


class RunWatch:
    """Waits until the run changes, the recheck interval passes, or the deadline comes."""

    def __init__(self, watcher: StreamClient, wait: float, recheck: float) -> None:
        self._watcher = watcher
        self._deadline = time.monotonic() + wait
        self._recheck = recheck

    @property
    def expired(self) -> bool:
        """The wait is over: its time is up, or the daemon is shutting down."""
        return self._watcher.closed or time.monotonic() >= self._deadline

    async def changed(self) -> None:
        """Return when something may have changed (or at the deadline)."""
        left = self._deadline - time.monotonic()
        if left > 0 and not self._watcher.closed:
            await self._watcher.next_batch(min(left, self._recheck))


@asynccontextmanager
async def watch_run(
    broadcaster: Broadcaster, run_id: str, wait: float, recheck: float
) -> AsyncIterator[RunWatch]:
    """Subscribed before the caller's first read, so nothing published after it is missed."""
    watcher = broadcaster.watch(asyncio.get_running_loop(), run_id)
    try:
        yield RunWatch(watcher, wait, recheck)
    finally:
        broadcaster.unsubscribe(watcher)
