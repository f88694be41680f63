"""Opening files that are not gpuwarden databases: one line naming the file, never a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.db import open_db


def test_garbage_empty_foreign_and_directory_files_are_refused_in_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_text("this is not sqlite\n" * 100)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    cases = [
        (garbage, True, "not a usable gpuwarden database (file is not a database) — check --db"),
        (empty, True, "not a gpuwarden database (no gpuwarden schema in it) — check --db"),
        (foreign, True, "not a gpuwarden database (no gpuwarden schema in it) — check --db"),
        (tmp_path, True, "is a directory — --db takes the database file"),
        (garbage, False, "not a usable gpuwarden database (file is not a database) — move the file aside"),
    ]
    for path, readonly, message in cases:
        with pytest.raises(UserError) as err:
            open_db(path, readonly=readonly)
        assert message in str(err.value) and str(path) in str(err.value)
        assert "\n" not in str(err.value)
    assert garbage.read_text().startswith("this is not sqlite")  # nothing was written to it


def test_a_new_database_is_created_and_then_opens_read_only(tmp_path: Path) -> None:
    path = tmp_path / "new" / "gpuwarden.db"
    open_db(path).conn.close()
    db = open_db(path, readonly=True)
    assert db.execute("PRAGMA user_version").fetchone()[0] > 0
    db.conn.close()


# A writer killed in the middle of a transaction, its changes spilled to the file: it leaves a
# hot rollback journal behind, as a run folder's `exec` does when Slurm SIGKILLs its job.
KILLED_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 1")
conn.execute("BEGIN IMMEDIATE")
for ts in range(5000):
    conn.execute("INSERT INTO host_samples (ts) VALUES (?)", (ts,))
os.kill(os.getpid(), 9)
"""


def test_a_store_its_writer_left_mid_transaction_reads_as_last_committed(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "run.db"
    open_db(path, journal="delete").conn.close()
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], check=False)
    assert killed.returncode == -9
    assert path.with_name("run.db-journal").exists()  # hot: read-only opens failed on it
    db = open_db(path, readonly=True)
    try:
        assert db.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 0
    finally:
        db.conn.close()
    assert not path.with_name("run.db-journal").exists()
