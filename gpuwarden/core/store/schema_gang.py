"""Schema v3: multi-process attempts ("gangs").

An attempt records how many processes it started (`world_size`); rank 0 writes the attempt's
`events.jsonl`, whose stored offset stays in `attempts.events_offset`, and every other rank its own
`events.rank<N>.jsonl`, whose offset is a row of `rank_offsets`. Each file is tailed from its own
offset and each offset moves in the same transaction as the events read up to it.
"""

from __future__ import annotations

import sqlite_utils

_STATEMENTS = (
    "ALTER TABLE attempts ADD COLUMN world_size INTEGER NOT NULL DEFAULT 1",
    """CREATE TABLE rank_offsets (
        run_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        rank INTEGER NOT NULL CHECK (rank > 0),
        events_path TEXT NOT NULL,
        events_offset INTEGER NOT NULL DEFAULT 0,
        events_skipped INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, attempt, rank),
        FOREIGN KEY (run_id, attempt) REFERENCES attempts (run_id, attempt) ON DELETE CASCADE
    )""",
    # the run detail's per-rank view reads each rank's newest event of a type in one attempt
    "CREATE INDEX run_events_attempt_type ON run_events (run_id, attempt, type)",
)


def migrate_v3(db: sqlite_utils.Database) -> None:
    """Add the gang columns and table (called inside the migration's transaction)."""
    for statement in _STATEMENTS:
        db.conn.execute(statement)
