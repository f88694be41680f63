"""Schema v6: each attempt's GPU energy counters, read at the moment it started and ended.

The samples are read at the sampling cadence, so an attempt shorter than the interval sees too
little of them; these two readings make its energy exact whatever the cadence. A table of its
own (one row per attempt, GPU and edge): deleting the run or the attempt deletes its readings.
"""

from __future__ import annotations

import sqlite_utils

_DDL = """
CREATE TABLE attempt_energy (
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gpu TEXT NOT NULL,              -- the GPU's UUID
    edge TEXT NOT NULL CHECK (edge IN ('start', 'end')),
    ts REAL NOT NULL,               -- when the counter was read
    energy_mj INTEGER NOT NULL,     -- NVML's counter: mJ since the driver loaded
    PRIMARY KEY (run_id, attempt, gpu, edge),
    FOREIGN KEY (run_id, attempt) REFERENCES attempts (run_id, attempt) ON DELETE CASCADE
)
"""


def migrate_v6(db: sqlite_utils.Database) -> None:
    """Create the table (called inside the migration's transaction)."""
    db.conn.execute(_DDL)
