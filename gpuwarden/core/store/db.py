"""Opening the database: pragmas, schema version and migrations.

The daemon holds the only writing connection (one writer thread); everyone else opens the file
read-only. WAL lets readers go on while the writer commits once per tick.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal

import sqlite_utils

from gpuwarden.core.errors import UserError
from gpuwarden.core.private import FILE_MODE, make_dirs, make_private
from gpuwarden.core.storage_fault import StorageFault, storage_fault
from gpuwarden.core.store.migrations import MIGRATIONS, SCHEMA_VERSION
from gpuwarden.core.store.transaction import transaction

Journal = Literal["wal", "delete"]


def open_db(path: Path | str, *, readonly: bool = False, journal: Journal = "wal") -> sqlite_utils.Database:
    """Open (and for writers, create and migrate) the store at `path`.

    `journal`: WAL lets readers read while the daemon writes, but needs shared memory between
    them, which a network filesystem (NFS, Lustre) does not give; a run folder's store, written
    by one `gpuwarden exec`, uses the rollback journal ("delete"), which is safe there.

    A file that is not a gpuwarden database (another program's, damaged, a directory) is a
    UserError naming it, never a traceback.
    """
    try:
        return _open(path, readonly, journal)
    except sqlite3.DatabaseError as exc:
        if not readonly and (fault := storage_fault(exc, folder=Path(path).parent, db=Path(path))):
            raise UserError(cannot_write(fault)) from None
        hint = "check --db" if readonly else "move the file aside and a new database is created in its place"
        raise UserError(f"{path}: not a usable gpuwarden database ({exc}) — {hint}") from None


def cannot_write(fault: StorageFault) -> str:
    """Why the daemon cannot open its database for writing, in one line with the fix."""
    return f"{fault.path}: cannot be written ({fault.why}) — {fault.fix}"


def _open(path: Path | str, readonly: bool, journal: Journal = "wal") -> sqlite_utils.Database:
    if str(path) == ":memory:":
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    elif readonly:
        p = Path(path)
        if not p.exists():
            raise UserError(f"{p}: no gpuwarden database there — check --db or start the daemon once")
        if p.is_dir():
            raise UserError(f"{p} is a directory — --db takes the database file (gpuwarden.db)")
        conn = _connect_readonly(p)
    else:
        p = Path(path)
        _create_private(p)
        conn = sqlite3.connect(str(p), check_same_thread=False, isolation_level=None, timeout=10)
    try:
        db = sqlite_utils.Database(conn)
        conn.execute("PRAGMA busy_timeout = 5000")
        if not readonly:
            conn.execute(f"PRAGMA journal_mode = {'WAL' if journal == 'wal' else 'DELETE'}")
            # WAL is durable enough at NORMAL; a rollback journal needs FULL to survive a crash.
            conn.execute(f"PRAGMA synchronous = {'NORMAL' if journal == 'wal' else 'FULL'}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(db)
            return db
        version = schema_version(db)
        if version > SCHEMA_VERSION:
            raise UserError(
                f"{path}: database schema v{version} is newer than this gpuwarden (v{SCHEMA_VERSION})"
                " — upgrade gpuwarden"
            )
        if version == 0:
            # A SQLite file gpuwarden never migrated: empty, or another program's.
            raise UserError(f"{path}: not a gpuwarden database (no gpuwarden schema in it) — check --db")
        return db
    except BaseException:
        conn.close()
        raise


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. A WAL database copied without its `-shm` file to a folder that
    cannot be written (a backup, a read-only mount) cannot be opened so: SQLite must create that
    file. Without a `-wal` file nothing is left to replay, so the file is read as it is."""
    _roll_back_hot_journal(path)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA user_version").fetchone()
    except sqlite3.OperationalError:
        if path.with_name(path.name + "-wal").exists() or os.access(path.parent, os.W_OK):
            raise
        conn.close()
        uri = f"file:{path}?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    return conn


def _roll_back_hot_journal(path: Path) -> None:
    """A rollback journal left by a writer killed mid-transaction (a run folder's `exec` that
    Slurm SIGKILLed) makes every read-only open fail ("attempt to write a readonly database")
    until a writer rolls it back. Where this user may write, a read-write open does that (SQLite
    rolls back a hot journal on its first read), so the run's last committed state reads."""
    journal = path.with_name(path.name + "-journal")
    if not journal.exists() or not os.access(path.parent, os.W_OK) or not os.access(path, os.W_OK):
        return
    try:
        conn = sqlite3.connect(str(path), timeout=5)
        try:
            conn.execute("PRAGMA user_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return  # the read-only open says what is wrong


def _create_private(path: Path) -> None:
    """The database file 0600 before SQLite opens it: SQLite gives its -wal and -shm files the
    database's mode, so the whole store is owner-only whatever the umask. A file an older
    version left readable is tightened."""
    if path.is_dir():
        inside = path / "gpuwarden.db"
        raise UserError(f"{path} is a directory — set paths.db to the database file in it ({inside})")
    try:
        make_dirs(path.parent)  # a new folder is owner-only too
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
        for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            make_private(part)
    except OSError as exc:
        fault = storage_fault(exc, folder=path.parent, db=path)
        if path.exists() and fault is not None:
            raise UserError(cannot_write(fault)) from None
        raise UserError(
            f"{path}: cannot create the database there ({exc.strerror or exc}) — "
            "choose a place you can write (--db, or paths.db in the config)"
        ) from None


def schema_version(db: sqlite_utils.Database) -> int:
    row = db.execute("PRAGMA user_version").fetchone()
    return int(row[0]) if row else 0


def migrate(db: sqlite_utils.Database) -> int:
    """Apply every migration above the file's `user_version`, each in its own transaction."""
    current = schema_version(db)
    if current > SCHEMA_VERSION:
        raise UserError(
            f"database schema v{current} is newer than this gpuwarden (v{SCHEMA_VERSION}) — upgrade gpuwarden"
        )
    for version, _description, apply in MIGRATIONS:
        if version <= current:
            continue
        conn = db.conn
        with transaction(conn):
            apply(db)
            conn.execute(f"PRAGMA user_version = {int(version)}")
        current = version
    return current
