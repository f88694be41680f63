"""The store-writer thread: the only connection that writes the database.

Other threads hand it work as callables through a queue. `call` waits for the result (state
changes are committed before the supervisor acts on them); `submit` does not (samples). Work runs
in order, so a state change submitted after a tick is never committed before it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db

T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.writer")

Job = Callable[[sqlite_utils.Database], object]


class StoreWriter:
    """Owns the write connection on a thread named `store-writer`."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._queue: queue.Queue[tuple[Job, Future[object]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._ready: Future[None] = Future()
        self.db: sqlite_utils.Database | None = None

    def start(self) -> None:
        """Open (create, migrate) the database on the writer thread; raises what opening raised."""
        self._thread.start()
        self._ready.result()

    def _run(self) -> None:
        try:
            self.db = open_db(self.db_path)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        while True:
            item = self._queue.get()
            if item is None:
                break
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job(self.db))
            except BaseException as exc:
                log.debug("store job failed: %s", exc)
                future.set_exception(exc)
        self.db.conn.close()

    def submit(self, job: Callable[[sqlite_utils.Database], T]) -> Future[T]:
        """Queue `job(db)`; the future holds its result or exception."""
        future: Future[T] = Future()
        self._queue.put((job, future))  # type: ignore[arg-type]
        return future

    def call(self, job: Callable[[sqlite_utils.Database], T], timeout: float = 30.0) -> T:
        """Run `job(db)` on the writer thread and wait for it (committed when this returns)."""
        if threading.current_thread() is self._thread:
            assert self.db is not None
            return job(self.db)
        return self.submit(job).result(timeout)

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def stop(self) -> None:
        """Finish queued work, then close the connection."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)
