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
