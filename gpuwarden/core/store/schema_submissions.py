"""Schema v5: the key each submit was sent with, so a retried submit finds the run the first made.

A table of its own, as the environment is: no reader of a run row sees it, and deleting the run
deletes it. `digest` is the submitted request's hash: one key sent with another request is the
client's mistake, refused rather than answered with an unrelated run.
"""

from __future__ import annotations

import sqlite_utils

_DDL = """
CREATE TABLE run_submissions (
    key TEXT PRIMARY KEY,           -- the client's Idempotency-Key
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    digest TEXT NOT NULL            -- sha256 of the request it came with
)
"""


def migrate_v5(db: sqlite_utils.Database) -> None:
    """Create the table (called inside the migration's transaction)."""
    db.conn.execute(_DDL)
