"""A database that opens but is damaged further in (a bad disk, a copy cut short), read with --db."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

from tests.daemon.conftest import FINAL, DaemonHandle, command_spec

PAGE = 4096


def _damage_the_samples(db: Path) -> None:
    """Scribble over the pages of the telemetry only: the runs still read, the history does not."""
    with closing(sqlite3.connect(db)) as conn:
        pages = [row[0] for row in conn.execute("SELECT pageno FROM dbstat WHERE name LIKE '%samples%'")]
    with db.open("r+b") as fh:
        for page in pages:
            fh.seek((page - 1) * PAGE + 8)
            fh.write(os.urandom(PAGE - 8))


def test_a_damaged_database_is_one_line_not_a_traceback(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("kept", "import time; time.sleep(2)"))  # on a GPU: its report reads samples
    gw.wait_state(run["id"], FINAL)
    gw.wait_samples(count=20)
    copy = gw.root / "copy.db"
    with closing(sqlite3.connect(gw.db)) as live, closing(sqlite3.connect(copy)) as out:
        live.backup(out)
    _damage_the_samples(copy)
    for command in ("report", "doctor"):
        result = gw.cli(command, run["id"], "--db", str(copy))
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(
            "gpuwarden: the database is damaged (database disk image is malformed)"
        )
