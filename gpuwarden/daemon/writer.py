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
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import Journal, open_db
from gpuwarden.core.store.transaction import rollback
from gpuwarden.daemon.storage_health import StorageHealth

T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.writer")

Job = Callable[[sqlite_utils.Database], object]


class StoreWriter:
    """Owns the write connection on a thread named `store-writer`; tells `health` of every write
    the disk refuses, and of every write committed (which ends such a fault)."""

    def __init__(self, db_path: Path, health: StorageHealth | None = None, journal: Journal = "wal") -> None:
        self.db_path = db_path
        self.journal: Journal = journal
        self.health = health or StorageHealth(db_path, db_path.parent)
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
            self.db = open_db(self.db_path, journal=self.journal)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        while True:
            item = self._queue.get()
            if item is None:
                break
            job, future = item
            if future.set_running_or_notify_cancel():
                self._do(self.db, job, future)
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

    def _do(self, db: sqlite_utils.Database, job: Job, future: Future[object]) -> None:
        changes = db.conn.total_changes
        try:
            result = job(db)
        except BaseException as exc:
            rollback(db.conn)  # whatever the job left open: the next one starts clean
            if not self.health.report(exc, database=True):
                log.debug("store job failed: %s", exc)  # the caller hears of it
            future.set_exception(exc)
            return
        if db.conn.total_changes != changes:
            self.health.stored()
        future.set_result(result)

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
