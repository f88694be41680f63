"""The live stream: frames fanned out to Server-Sent-Events clients without ever blocking.

Publishers (sampler, supervisor) run on plain threads; each client is an asyncio consumer with a
bounded queue. A full queue drops its OLDEST frame and counts it, so a slow client sees fresh data
and a `dropped` total, and the daemon never waits for anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any

FRAME_TYPES = ("sample", "run", "event")
DEFAULT_QUEUE = 256
KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class Frame:
    """One stream message: `kind` names it, `body` is pre-encoded JSON, `run_id` for filtering."""

    seq: int
    kind: str
    body: str
    run_id: str | None = None


class StreamClient:
    """One subscriber's bounded queue, fed from any thread, drained on the event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        maxlen: int,
        kinds: Collection[str],
        run_id: str | None,
    ) -> None:
        self._loop = loop
        self._frames: deque[Frame] = deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._signalled = False
        self.kinds = frozenset(kinds)
        self.run_id = run_id
        self.dropped = 0
        self.closed = False

    def wants(self, frame: Frame) -> bool:
        if frame.kind not in self.kinds:
            return False
        return self.run_id is None or frame.run_id is None or frame.run_id == self.run_id

    def push(self, frame: Frame) -> None:
        """Queue a frame (dropping the oldest when full) and wake the consumer; never blocks."""
        with self._lock:
            if len(self._frames) >= self._maxlen:
                self._frames.popleft()
                self.dropped += 1
            self._frames.append(frame)
            wake = not self._signalled
            self._signalled = True
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:
                self.closed = True  # the loop is gone: the server is shutting down

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._ready.set)

    async def frames(self, keepalive: float = KEEPALIVE_S) -> AsyncIterator[str]:
        """SSE text: frames as they come, a comment line when idle (detects dead peers)."""
        yield ": gpuwarden stream\nretry: 2000\n\n"
        while not self.closed:
            batch = await self.next_batch(keepalive)
            if batch is None:
                yield ": keepalive\n\n"
                continue
            for frame in batch:
                yield encode_sse(frame, self.dropped)

    async def next_batch(self, timeout: float) -> list[Frame] | None:
        """Every frame queued so far, waiting up to `timeout` seconds for the first; None when
        none came in time (an empty list when the client was closed meanwhile)."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return None
        with self._lock:
            batch = list(self._frames)
            self._frames.clear()
            self._ready.clear()
            self._signalled = False
        return batch


def encode_sse(frame: Frame, dropped: int) -> str:
    """`id:`, `event:` and one `data:` line; `dropped` is spliced into the JSON object."""
    body = frame.body
    data = f'{{"dropped":{dropped},{body[1:]}' if body.startswith("{") and body != "{}" else body
    return f"id: {frame.seq}\nevent: {frame.kind}\ndata: {data}\n\n"


class Broadcaster:
    """Fan-out to every connected StreamClient, and to the watchers of waiting requests."""

    def __init__(self, queue_size: int = DEFAULT_QUEUE) -> None:
        self.queue_size = queue_size
        self._clients: set[StreamClient] = set()
        # Long-polling requests waiting for a run to change: fed like clients, but not counted
        # as stream clients (samples are encoded only for those).
        self._watchers: set[StreamClient] = set()
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    def subscribe(
        self,
        loop: asyncio.AbstractEventLoop,
        kinds: Collection[str] = FRAME_TYPES,
        run_id: str | None = None,
    ) -> StreamClient:
        client = StreamClient(loop, self.queue_size, kinds, run_id)
        with self._lock:
            self._clients.add(client)
        return client

    def watch(self, loop: asyncio.AbstractEventLoop, run_id: str) -> StreamClient:
        """A watcher woken by the run's `run` and `event` frames (what a long poll waits for)."""
        watcher = StreamClient(loop, self.queue_size, ("run", "event"), run_id)
        with self._lock:
            self._watchers.add(watcher)
        return watcher

    def unsubscribe(self, client: StreamClient) -> None:
        with self._lock:
            self._clients.discard(client)
            self._watchers.discard(client)

    @property
    def client_count(self) -> int:
        """Connected stream clients (watchers not included)."""
        with self._lock:
            return len(self._clients)

    def publish(self, kind: str, data: dict[str, Any], run_id: str | None = None) -> None:
        """Encode once, push to every interested client."""
        with self._lock:
            clients = [*self._clients, *self._watchers]
        if not clients:
            return
        frame = Frame(next(self._seq), kind, json.dumps(data, separators=(",", ":"), default=str), run_id)
        for client in clients:
            if client.wants(frame):
                client.push(frame)

    def close_all(self) -> None:
        """End every stream (daemon shutdown), so the server is not held open by SSE clients."""
        with self._lock:
            clients = [*self._clients, *self._watchers]
            self._clients.clear()
            self._watchers.clear()
        for client in clients:
            client.close()
