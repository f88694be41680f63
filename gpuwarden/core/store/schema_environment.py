"""Schema v4: the environment a run was submitted with.

A table of its own rather than a column of `runs`: every reader of a run row (the API, the live
stream, the dashboard's database view) then cannot show it by accident, and only what starts the
run's processes reads it. The variables may hold tokens; the database is owner-only.
"""

from __future__ import annotations

import sqlite_utils

_DDL = """
CREATE TABLE run_environments (
    run_id TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    variables TEXT NOT NULL         -- JSON object: name → value
)
"""


def migrate_v4(db: sqlite_utils.Database) -> None:
    """Create the table (called inside the migration's transaction)."""
    db.conn.execute(_DDL)
