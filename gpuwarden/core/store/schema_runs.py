"""Schema v2: the runs the daemon supervises, their attempts, events, retunes and metrics.

JSON columns hold documents the daemon writes whole (specs, event payloads, GPU lists); everything
that is filtered or sorted on is a real column.
"""

from __future__ import annotations

import re

import sqlite_utils

_DDL = """
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,             -- current spec (JSON): edits and retunes change it
    submitted_spec TEXT NOT NULL,   -- the spec as submitted (JSON)
    run_dir TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    attempt INTEGER NOT NULL DEFAULT 0,  -- number of the latest attempt, 0 before the first
    message TEXT,                   -- one line: why the run is in its state
    stop_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_state ON runs (state);
CREATE INDEX runs_name ON runs (name);

CREATE TABLE attempts (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL,            -- starting | running | ended
    pid INTEGER,
    create_time REAL,               -- psutil create time: (pid, create_time) names the process
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    signal INTEGER,
    classification TEXT,            -- succeeded | failed | oom | stopped | terminated | interrupted
    reason TEXT,
    adopted INTEGER NOT NULL DEFAULT 0,
    events_offset INTEGER NOT NULL DEFAULT 0,  -- bytes of events.jsonl already stored
    events_skipped INTEGER NOT NULL DEFAULT 0, -- lines that did not parse
    stdout_path TEXT NOT NULL,
    stderr_path TEXT NOT NULL,
    events_path TEXT NOT NULL,
    gpus TEXT NOT NULL DEFAULT '[]', -- JSON list of GPU UUIDs; [] = CPU
    oom_kill_before INTEGER,        -- cgroup oom_kill counter at spawn, when readable
    PRIMARY KEY (run_id, attempt)
);

CREATE TABLE run_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt INTEGER,
    ts REAL NOT NULL,
    type TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT 'runner',  -- runner (events.jsonl) | daemon
    payload TEXT NOT NULL            -- the whole event (JSON)
);
CREATE INDEX run_events_run ON run_events (run_id, id);

CREATE TABLE retunes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,       -- the attempt that failed
    ts REAL NOT NULL,
    from_json TEXT NOT NULL,        -- the settings before (JSON)
    to_json TEXT NOT NULL,          -- the settings after (JSON)
    verdict TEXT,
    evidence_json TEXT,
    prediction_json TEXT,
    outcome TEXT                    -- filled in when the next attempt ends
);
CREATE INDEX retunes_run ON retunes (run_id, id);

CREATE TABLE run_metrics (
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    ts REAL NOT NULL,
    step INTEGER,
    samples_seen INTEGER,
    tokens_seen INTEGER,
    loss REAL,
    lr REAL,
    samples_per_s REAL,
    tokens_per_s REAL,
    batch_size INTEGER,
    mem_allocated INTEGER,
    mem_reserved INTEGER,
    mem_peak INTEGER
);
CREATE INDEX run_metrics_run ON run_metrics (run_id, ts);
"""


def migrate_v2(db: sqlite_utils.Database) -> None:
    """Create the run tables (called inside the migration's transaction)."""
    # comments go first: `;` splitting must not see them (and sqlite3.execute takes one statement)
    for statement in re.sub(r"--[^\n]*", "", _DDL).split(";"):
        if statement.strip():
            db.conn.execute(statement)
