"""Telemetry schema (migration v1): GPUs, raw samples, 1-minute and 1-hour rollups, processes, host.

Time unit: every `ts` and `bucket` column is INTEGER **milliseconds** since the Unix epoch (UTC).
Integers keep rows small, make bucket arithmetic exact (`ts / 60000 * 60000`) and never compare
floats for equality; the Python API speaks float seconds and converts at the edge.

Layout choices, and why:
- `gpus.id` is a small INTEGER PRIMARY KEY (rowid alias) and `gpus.uuid` is UNIQUE: sample rows
  reference the integer, not the 40-character UUID text, so a raw row stays near 60 bytes.
- `samples` and the rollups are WITHOUT ROWID tables clustered on (gpu_id, ts|bucket): the history
  query and retention both read one GPU's time range, which is then one contiguous primary-key
  search with no second lookup, and no separate index has to be maintained on insert.
- One column per metric in GPU_METRICS (affinity from GpuSample's annotation: INTEGER for ints,
  REAL for floats; NULL where a GPU cannot report), plus `lost` and `energy_delta_mj`, the energy
  counter's increase since the previous sample of that GPU (a drop of the counter is a reset: the
  post-reset value is the delta), so energy sums over any tier without re-reading neighbours.
- Rollups keep, per metric, `<m>_sum`, `<m>_min`, `<m>_max` and `<m>_n` (the number of non-NULL
  values), plus `n` (samples in the bucket), `lost_n` and `energy_delta_mj` (summed). Sums and
  per-metric counts, not averages, so an hour re-aggregates exactly from its minutes and a metric
  that was NULL for part of a bucket still averages over the values that exist.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlite_utils

from gpuwarden.core.telemetry.types import GPU_METRICS, HOST_METRICS, GpuSample, HostSample

# Rollup bucket widths in milliseconds.
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


def _affinity(record: Any, name: str) -> str:
    """INTEGER for `int | None` fields, REAL otherwise (floats and anything unexpected)."""
    for f in dataclasses.fields(record):
        if f.name == name:
            return "INTEGER" if str(f.type).startswith("int") else "REAL"
    raise KeyError(name)


def metric_affinities(record: Any, metrics: tuple[str, ...]) -> dict[str, str]:
    """Column affinity per metric, derived from the record's annotations."""
    return {m: _affinity(record, m) for m in metrics}


GPU_AFFINITY = metric_affinities(GpuSample, GPU_METRICS)
HOST_AFFINITY = metric_affinities(HostSample, HOST_METRICS)


def _rollup_columns(affinity: dict[str, str]) -> str:
    cols = []
    for m, aff in affinity.items():
        cols += [f"{m}_sum REAL", f"{m}_min {aff}", f"{m}_max {aff}", f"{m}_n INTEGER NOT NULL DEFAULT 0"]
    return ",\n  ".join(cols)


# Long: the schema's DDL, one table after another; split up, the tables would be read apart.
def telemetry_ddl() -> list[str]:
    """The CREATE statements of schema v1, in order."""
    gpu_metric_cols = ",\n  ".join(f"{m} {aff}" for m, aff in GPU_AFFINITY.items())
    host_metric_cols = ",\n  ".join(f"{m} {aff}" for m, aff in HOST_AFFINITY.items())
    gpu_rollup = _rollup_columns(GPU_AFFINITY)
    host_rollup = _rollup_columns(HOST_AFFINITY)
    stmts = [
        """CREATE TABLE gpus (
  id INTEGER PRIMARY KEY,
  uuid TEXT NOT NULL UNIQUE,
  "index" INTEGER,
  name TEXT,
  pci_bus_id TEXT,
  memory_total INTEGER,
  power_limit_default_w REAL,
  power_limit_min_w REAL,
  power_limit_max_w REAL,
  max_sm_clock_mhz INTEGER,
  max_mem_clock_mhz INTEGER,
  compute_capability TEXT,
  driver_version TEXT,
  cuda_driver_version TEXT,
  mig_mode INTEGER,
  unsupported TEXT NOT NULL DEFAULT '[]',
  first_seen REAL NOT NULL,
  last_seen REAL NOT NULL,
  lost INTEGER NOT NULL DEFAULT 0
)""",
        f"""CREATE TABLE samples (
  gpu_id INTEGER NOT NULL REFERENCES gpus(id),
  ts INTEGER NOT NULL,
  lost INTEGER NOT NULL DEFAULT 0,
  {gpu_metric_cols},
  energy_delta_mj INTEGER,
  PRIMARY KEY (gpu_id, ts)
) WITHOUT ROWID""",
    ]
    for tier in ("1m", "1h"):
        stmts.append(
            f"""CREATE TABLE samples_{tier} (
  gpu_id INTEGER NOT NULL REFERENCES gpus(id),
  bucket INTEGER NOT NULL,
  n INTEGER NOT NULL,
  lost_n INTEGER NOT NULL DEFAULT 0,
  {gpu_rollup},
  energy_delta_mj INTEGER,
  PRIMARY KEY (gpu_id, bucket)
) WITHOUT ROWID"""
        )
    stmts.append(
        f"""CREATE TABLE host_samples (
  ts INTEGER PRIMARY KEY,
  {host_metric_cols}
)"""
    )
    for tier in ("1m", "1h"):
        stmts.append(
            f"""CREATE TABLE host_samples_{tier} (
  bucket INTEGER PRIMARY KEY,
  n INTEGER NOT NULL,
  {host_rollup}
)"""
        )
    stmts += [
        # Processes are read every few seconds, not every tick; `process_scans` records each read so
        # "the latest processes" is right even when the latest read found none.
        "CREATE TABLE process_scans (ts INTEGER PRIMARY KEY)",
        """CREATE TABLE gpu_processes (
  ts INTEGER NOT NULL,
  gpu_id INTEGER NOT NULL REFERENCES gpus(id),
  pid INTEGER NOT NULL,
  used_memory INTEGER,
  kind TEXT NOT NULL DEFAULT 'compute',
  name TEXT,
  cmdline TEXT,
  user TEXT,
  cpu_percent REAL,
  rss INTEGER
)""",
        # Latest-scan lookups and retention both go by time.
        "CREATE INDEX gpu_processes_ts ON gpu_processes (ts, gpu_id)",
    ]
    return stmts


def migrate_v1(db: sqlite_utils.Database) -> None:
    """Create the telemetry tables. Runs inside the migration runner's transaction.

    Plain DDL through `db.execute` rather than `db.create_table`: the latter may manage its own
    transaction, and WITHOUT ROWID tables with composite keys are clearer written out.
    """
    for stmt in telemetry_ddl():
        db.execute(stmt)
