"""One transaction on an autocommit connection, and undoing one a write failed in.

Writes of several store calls batch into one commit: inside a transaction already open, each
call's own transaction is a savepoint that joins it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT on an autocommit connection; ROLLBACK on any error. Inside a
    transaction already open, a savepoint that joins it: writes batched into one commit."""
    if conn.in_transaction:
        conn.execute("SAVEPOINT batched")
        try:
            yield
        except BaseException:
            if conn.in_transaction:  # else SQLite rolled the whole transaction back already
                conn.execute("ROLLBACK TO batched")
                conn.execute("RELEASE batched")
            raise
        conn.execute("RELEASE batched")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        rollback(conn)
        raise
    try:
        conn.execute("COMMIT")
    except sqlite3.Error:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> None:
    """Undo a transaction a write failed in. A full disk or an I/O error may have made SQLite
    roll it back already: then the caller must see that error, not ROLLBACK's "no transaction
    is active"; and a COMMIT the disk refused can leave it open, blocking the next BEGIN."""
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
