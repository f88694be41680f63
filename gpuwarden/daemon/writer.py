"""The store-writer thread: the only connection that writes the database.

Other threads hand it work as callables through a queue. `call` waits for the result (state
changes are committed before the supervisor acts on them); `submit` does not (samples). Work runs
in order, so a state change submitted after a tick is never committed before it.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db
from gpuwarden.daemon.storage_errors import storage_problem

T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.writer")

# A full disk fails every tick: one warning a minute says so without filling the log.
REFUSED_WARN_EVERY_S = 60.0

Job = Callable[[sqlite_utils.Database], object]


class StoreWriter:
    """Owns the write connection on a thread named `store-writer`."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._queue: queue.Queue[tuple[Job, Future[object]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._ready: Future[None] = Future()
        self.db: sqlite_utils.Database | None = None
        self._refused_warned_at = -REFUSED_WARN_EVERY_S  # monotonic time of the last warning

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
                self._failed(exc)
                future.set_exception(exc)
        self._checkpoint(self.db)
        self.db.conn.close()

    @staticmethod
    def _checkpoint(db: sqlite_utils.Database) -> None:
        """Move the WAL into the database file and empty it: the daemon's readers stay open until
        its process exits, so SQLite would not, and a copy of `gpuwarden.db` made after `down`
        would hold almost nothing (the rows would be in the `-wal` file beside it)."""
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:  # a reader mid-query, a full disk: the WAL stays valid
            log.warning("could not fold the WAL into the database file at shutdown: %s", exc)

    def _failed(self, exc: BaseException) -> None:
        """A full disk would otherwise lose every sample without a word: say so in one line."""
        problem = storage_problem(exc, self.db_path.parent, self.db_path)
        if problem is None:
            log.debug("store job failed: %s", exc)
        elif time.monotonic() - self._refused_warned_at >= REFUSED_WARN_EVERY_S:
            # Once a minute: some writes still fit (a reused WAL page), so they come and go.
            self._refused_warned_at = time.monotonic()
            log.warning("cannot write %s — samples and run updates are lost until there is space", problem)

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
