"""Telemetry store: raw GPU/host samples, rollups, processes, history queries and retention.

Writes come from the daemon's single writer thread, one transaction per tick. Rollups are
maintained as samples arrive, bucket by bucket: when a tick opens a new minute, the minute just
closed is aggregated from its raw rows (already committed, so a crash loses nothing: the first
tick after a restart folds whatever minutes were left unfolded), and the hour containing it is
re-aggregated from its minutes. Both folds are idempotent `INSERT OR REPLACE … SELECT … GROUP BY`
over one bucket, so rollups equal the aggregates of the raw rows by construction, a late sample
just re-folds its minute (a repeated gpu+ts keeps the first row), and a tick costs only its raw
inserts (a per-tick
UPSERT into both rollup tiers measured at ~0.43× the plain-insert rate; this design keeps ingest
near the raw rate). The open minute reaches `samples_1m` when it closes, and the open hour in
`samples_1h` trails by at most that minute; windows recent enough to care are served from raw.

All timestamps in the database are integer milliseconds; this API takes and returns float seconds.
"""

from __future__ import annotations

import json
import math
import operator
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlite_utils

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.schema_telemetry import HOUR_MS, MINUTE_MS
from gpuwarden.core.store.transaction import rollback
from gpuwarden.core.telemetry.types import (
    GPU_METRICS,
    HOST_METRICS,
    GpuProcess,
    GpuSample,
    GpuStatic,
    HostSample,
    Tick,
)

# The derived metric that history() turns into per-bucket energy deltas (joules).
ENERGY_METRIC = "energy_j"

# Tier choice bounds the rows a history query aggregates per returned point (cost grows with
# rows read, ~0.6 µs each on a 2-core machine, not with the size of the database): raw while a
# point spans under 15 s (≤ 15 rows a point at 1 Hz), 1-minute rollups while it spans under
# 15 minutes, the 1-hour rollups beyond. A coarser tier may return fewer than `points` points.
RAW_MAX_STEP_MS = 15_000
MINUTE_MAX_STEP_MS = 15 * MINUTE_MS

# How far back the first tick after a start looks for the previous energy reading of a GPU.
_ENERGY_SEED_MS = HOUR_MS

_GPU_STATIC_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "pci_bus_id",
    "memory_total",
    "power_limit_default_w",
    "power_limit_min_w",
    "power_limit_max_w",
    "max_sm_clock_mhz",
    "max_mem_clock_mhz",
    "compute_capability",
    "driver_version",
    "cuda_driver_version",
    "mig_mode",
)

_PROCESS_FIELDS: tuple[str, ...] = (
    "pid",
    "used_memory",
    "kind",
    "name",
    "cmdline",
    "user",
    "cpu_percent",
    "rss",
)

_gpu_metric_values = operator.attrgetter(*GPU_METRICS)
_host_metric_values = operator.attrgetter(*HOST_METRICS)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _floor(ms: int, width: int) -> int:
    return ms - ms % width


def _ceil(ms: int, width: int) -> int:
    return -((-ms) // width) * width


def _add(a: float | None, b: float | None) -> float | None:
    """SQL-style sum of two partial sums: NULL only when both are."""
    if a is None:
        return b
    return a if b is None else a + b


def _pick(f: Any, a: float | None, b: float | None) -> float | None:
    """min/max of two partial results, ignoring NULLs the way SQL aggregates do."""
    if a is None:
        return b
    return a if b is None else f(a, b)


def _retention_jobs(
    gids: list[int], raw_cut: int, min_cut: int, hour_cut: int, chunk_rows: int
) -> list[tuple[str, tuple[Any, ...]]]:
    """One chunked DELETE per table (per GPU for the sample tiers: each walks its primary key)."""
    jobs: list[tuple[str, tuple[Any, ...]]] = []
    for gid in gids:
        for table, col, cut in (
            ("samples", "ts", raw_cut),
            ("samples_1m", "bucket", min_cut),
            ("samples_1h", "bucket", hour_cut),
        ):
            jobs.append(
                (
                    f"DELETE FROM {table} WHERE gpu_id = ? AND {col} IN (SELECT {col} FROM {table}"
                    f" WHERE gpu_id = ? AND {col} < ? ORDER BY {col} LIMIT ?)",
                    (gid, gid, cut, chunk_rows),
                )
            )
    for table, col, cut in (
        ("host_samples", "ts", raw_cut),
        ("host_samples_1m", "bucket", min_cut),
        ("host_samples_1h", "bucket", hour_cut),
        ("process_scans", "ts", raw_cut),
    ):
        jobs.append(
            (
                f"DELETE FROM {table} WHERE {col} IN"
                f" (SELECT {col} FROM {table} WHERE {col} < ? ORDER BY {col} LIMIT ?)",
                (cut, chunk_rows),
            )
        )
    jobs.append(
        (
            "DELETE FROM gpu_processes WHERE rowid IN"
            " (SELECT rowid FROM gpu_processes WHERE ts < ? ORDER BY ts LIMIT ?)",
            (raw_cut, chunk_rows),
        )
    )
    return jobs


def _row_layout(metrics: list[str]) -> list[tuple[str, int, bool]]:
    """Where each metric starts in a history row, and whether it is energy (one sum, not four values)."""
    layout = []
    i = 0
    for m in metrics:
        layout.append((m, i, m == ENERGY_METRIC))
        i += 1 if m == ENERGY_METRIC else 4
    return layout


def _append_points(
    per_metric: dict[str, list[tuple[float, float, float, float]]],
    layout: list[tuple[str, int, bool]],
    ts: float,
    values: Sequence[Any],
) -> None:
    """One bucket's points; a metric with no reading in the bucket gets none (a gap, not a zero)."""
    for m, i, is_energy in layout:
        if is_energy:
            if values[i] is not None:
                joules = values[i] / 1000
                per_metric[m].append((ts, joules, joules, joules))
        elif values[i + 1]:
            per_metric[m].append((ts, values[i] / values[i + 1], float(values[i + 2]), float(values[i + 3])))


def _merge(metrics: Sequence[str], a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    """Combine two partial history rows of one bucket (sum, count, min, max per metric)."""
    out: list[Any] = []
    i = 0
    for m in metrics:
        if m == ENERGY_METRIC:
            out.append(_add(a[i], b[i]))
            i += 1
        else:
            out += [
                _add(a[i], b[i]),
                a[i + 1] + b[i + 1],
                _pick(min, a[i + 2], b[i + 2]),
                _pick(max, a[i + 3], b[i + 3]),
            ]
            i += 4
    return out


@dataclass
class History:
    """Downsampled series: `series[uuid][metric]` is a list of (bucket start s, avg, min, max).

    Buckets without a value for a metric are left out. For `energy_j` each tuple carries the
    energy used in the bucket, in joules, in all three value slots.
    """

    tier: str  # "raw" | "1m" | "1h"
    step: float  # seconds per returned point
    start: float
    end: float
    series: dict[str, dict[str, list[tuple[float, float, float, float]]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form: tuples become lists."""
        return {
            "tier": self.tier,
            "step": self.step,
            "start": self.start,
            "end": self.end,
            "series": {
                key: {metric: [list(p) for p in points] for metric, points in metrics.items()}
                for key, metrics in self.series.items()
            },
        }


@dataclass(frozen=True)
class _Tier:
    name: str
    width_ms: int  # bucket width; raw uses 1 (its rows are points in time)
    gpu_table: str
    host_table: str
    ts_col: str


_RAW = _Tier("raw", 1, "samples", "host_samples", "ts")
_MIN = _Tier("1m", MINUTE_MS, "samples_1m", "host_samples_1m", "bucket")
_HOUR = _Tier("1h", HOUR_MS, "samples_1h", "host_samples_1h", "bucket")
_TIERS = (_RAW, _MIN, _HOUR)


def _rollup_cols(metrics: Sequence[str]) -> list[str]:
    return [f"{m}_{part}" for m in metrics for part in ("sum", "min", "max", "n")]


def _fold_from_raw_sql(metrics: Sequence[str], *, gpu: bool) -> str:
    """Aggregate raw rows of one range into 1-minute rows (replacing what was there)."""
    aggs = [f"{a}({m})" for m in metrics for a in ("sum", "min", "max", "count")]
    bucket = f"ts - ts % {MINUTE_MS}"
    if gpu:
        cols = ["gpu_id", "bucket", "n", "lost_n", *_rollup_cols(metrics), "energy_delta_mj"]
        sel = ["gpu_id", bucket, "count(*)", "sum(lost)", *aggs, "sum(energy_delta_mj)"]
        where, group, table = "gpu_id = ? AND ts >= ? AND ts < ?", f"gpu_id, {bucket}", "samples"
        target = "samples_1m"
    else:
        cols = ["bucket", "n", *_rollup_cols(metrics)]
        sel = [bucket, "count(*)", *aggs]
        where, group, table, target = "ts >= ? AND ts < ?", bucket, "host_samples", "host_samples_1m"
    return (
        f"INSERT OR REPLACE INTO {target} ({', '.join(cols)}) SELECT {', '.join(sel)} "
        f"FROM {table} WHERE {where} GROUP BY {group}"
    )


def _fold_hours_sql(metrics: Sequence[str], *, gpu: bool) -> str:
    """Re-aggregate 1-minute rows of one range into 1-hour rows (replacing what was there)."""
    aggs = [
        f"{a}({m}_{part})"
        for m in metrics
        for a, part in (("sum", "sum"), ("min", "min"), ("max", "max"), ("sum", "n"))
    ]
    bucket = f"bucket - bucket % {HOUR_MS}"
    if gpu:
        cols = ["gpu_id", "bucket", "n", "lost_n", *_rollup_cols(metrics), "energy_delta_mj"]
        sel = ["gpu_id", bucket, "sum(n)", "sum(lost_n)", *aggs, "sum(energy_delta_mj)"]
        where, group, table, target = (
            "gpu_id = ? AND bucket >= ? AND bucket < ?",
            f"gpu_id, {bucket}",
            "samples_1m",
            "samples_1h",
        )
    else:
        cols = ["bucket", "n", *_rollup_cols(metrics)]
        sel = [bucket, "sum(n)", *aggs]
        where, group, table, target = (
            "bucket >= ? AND bucket < ?",
            bucket,
            "host_samples_1m",
            "host_samples_1h",
        )
    return (
        f"INSERT OR REPLACE INTO {target} ({', '.join(cols)}) SELECT {', '.join(sel)} "
        f"FROM {table} WHERE {where} GROUP BY {group}"
    )


class TelemetryStore:
    """Telemetry tables of one database. Thread-safe; meant for one writer plus readers."""

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db
        self.conn = db.conn
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        self._uuids: dict[int, str] = {}
        # Writer state; dropped whenever a write transaction rolls back, rebuilt from the database.
        self._last_energy: dict[int, tuple[int, int]] = {}  # gpu -> (ts ms, counter mJ)
        self._lost: dict[int, bool] = {}
        self._seen: dict[int, float] = {}  # last non-lost sample per GPU, flushed once a minute
        self._open_minute: int | None = None
        self._dirty_minutes: set[int] = set()
        self._recovered = False

        gpu_cols = ["gpu_id", "ts", "lost", *GPU_METRICS, "energy_delta_mj"]
        self._insert_sample = (
            # A repeated (gpu, ts) keeps the first row: its energy delta is the one accounted for.
            f"INSERT OR IGNORE INTO samples ({', '.join(gpu_cols)}) VALUES ({', '.join('?' * len(gpu_cols))})"
        )
        host_cols = ["ts", *HOST_METRICS]
        self._insert_host = (
            f"INSERT OR IGNORE INTO host_samples ({', '.join(host_cols)}) "
            f"VALUES ({', '.join('?' * len(host_cols))})"
        )
        self._insert_process = (
            "INSERT INTO gpu_processes (ts, gpu_id, pid, used_memory, kind, name, cmdline, user,"
            " cpu_percent, rss) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._fold_gpu_minutes = _fold_from_raw_sql(GPU_METRICS, gpu=True)
        self._fold_host_minutes = _fold_from_raw_sql(HOST_METRICS, gpu=False)
        self._fold_gpu_hours = _fold_hours_sql(GPU_METRICS, gpu=True)
        self._fold_host_hours = _fold_hours_sql(HOST_METRICS, gpu=False)
        self._load_ids()

    # ----------------------------------------------------------------------------------- helpers

    def _load_ids(self) -> None:
        rows = self.conn.execute("SELECT id, uuid FROM gpus").fetchall()
        self._ids = {str(uuid): int(gid) for gid, uuid in rows}
        self._uuids = {gid: uuid for uuid, gid in self._ids.items()}

    def _reset_writer_state(self) -> None:
        """Forget cached state after a rollback; it is rebuilt from what was committed."""
        self._load_ids()
        self._last_energy.clear()
        self._lost.clear()
        self._seen.clear()
        self._open_minute = None
        self._dirty_minutes.clear()
        self._recovered = False

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction; inside a caller's transaction, a savepoint that joins it."""
        conn = self.conn
        if conn.in_transaction:
            conn.execute("SAVEPOINT telemetry")
            try:
                yield
            except BaseException:
                if conn.in_transaction:  # else SQLite rolled the whole transaction back already
                    conn.execute("ROLLBACK TO telemetry")
                    conn.execute("RELEASE telemetry")
                self._reset_writer_state()
                raise
            conn.execute("RELEASE telemetry")
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            self._reset_writer_state()
            raise

    def _gpu_id(self, uuid: str, ts: float) -> int:
        """The small integer id of `uuid`, registering an unknown GPU on the fly."""
        gid = self._ids.get(uuid)
        if gid is None:
            self.conn.execute(
                "INSERT INTO gpus (uuid, first_seen, last_seen) VALUES (?, ?, ?)"
                " ON CONFLICT(uuid) DO NOTHING",
                (uuid, ts, ts),
            )
            gid = int(self.conn.execute("SELECT id FROM gpus WHERE uuid = ?", (uuid,)).fetchone()[0])
            self._ids[uuid] = gid
            self._uuids[gid] = uuid
        return gid

    def _resolve(self, gpus: Sequence[str] | None) -> list[int]:
        self._load_ids()
        if gpus is None:
            return sorted(self._ids.values())
        unknown = [u for u in gpus if u not in self._ids]
        if unknown:
            known = ", ".join(sorted(self._ids)) or "none recorded yet"
            raise UserError(f"unknown GPU {', '.join(unknown)}; known GPUs: {known}", code="not_found")
        return [self._ids[u] for u in gpus]

    def _previous_energy(self, gid: int, ts_ms: int) -> tuple[int, int] | None:
        """(ts ms, counter) of the GPU's newest energy reading, from memory or, once, the database."""
        if gid in self._last_energy:
            return self._last_energy[gid]
        row = self.conn.execute(
            "SELECT ts, energy_mj FROM samples WHERE gpu_id = ? AND ts >= ? AND energy_mj IS NOT NULL"
            " ORDER BY ts DESC LIMIT 1",
            (gid, ts_ms - _ENERGY_SEED_MS),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def _note_minute(self, ts_ms: int) -> None:
        minute = _floor(ts_ms, MINUTE_MS)
        if self._open_minute is None:
            self._open_minute = minute
        elif minute > self._open_minute:
            self._dirty_minutes.add(self._open_minute)
            self._open_minute = minute
        elif minute < self._open_minute:
            # A late sample for a closed minute: fold that minute again.
            self._dirty_minutes.add(minute)

    # ------------------------------------------------------------------------------------ writes

    def upsert_gpus(self, gpus: list[GpuStatic], ts: float) -> None:
        """Record (or refresh) the static description of each GPU, marking it seen at `ts`."""
        cols = ['"index"' if f == "index" else f for f in _GPU_STATIC_FIELDS]
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols)
        sql = (
            f"INSERT INTO gpus (uuid, {', '.join(cols)}, unsupported, first_seen, last_seen, lost) "
            f"VALUES (?, {', '.join('?' * len(cols))}, ?, ?, ?, 0) ON CONFLICT(uuid) DO UPDATE SET "
            f"{updates}, unsupported = excluded.unsupported, last_seen = excluded.last_seen, lost = 0"
        )
        rows = []
        for g in gpus:
            values = [getattr(g, f) for f in _GPU_STATIC_FIELDS]
            values[_GPU_STATIC_FIELDS.index("mig_mode")] = None if g.mig_mode is None else int(g.mig_mode)
            rows.append((g.uuid, *values, json.dumps(list(g.unsupported)), ts, ts))
        with self._lock, self._transaction():
            self.conn.executemany(sql, rows)
            self._load_ids()
            for g in gpus:
                self._lost[self._ids[g.uuid]] = False

    def write_tick(self, tick: Tick) -> None:
        """Store one tick (GPU rows, host row, processes) in one transaction; fold closed buckets."""
        with self._lock, self._transaction():
            if not self._recovered:
                self._recover()
            self._write_gpu_samples(tick.gpus)
            if tick.host is not None:
                ts_ms = _ms(tick.host.ts)
                self.conn.execute(self._insert_host, (ts_ms, *_host_metric_values(tick.host)))
                self._note_minute(ts_ms)
            if tick.processes is not None:
                self._write_processes(tick.processes, tick.ts)
            if self._dirty_minutes:
                self._fold(sorted(self._dirty_minutes))
                self._dirty_minutes.clear()

    def _write_gpu_samples(self, samples: list[GpuSample]) -> None:
        rows = []
        lost_changes = []
        for s in samples:
            gid = self._gpu_id(s.uuid, s.ts)
            ts_ms = _ms(s.ts)
            delta = None if s.energy_mj is None else self._energy_delta(gid, ts_ms, s.energy_mj)
            if self._lost.get(gid) != s.lost:
                lost_changes.append((int(s.lost), s.ts, gid))
                self._lost[gid] = s.lost
            if not s.lost:
                self._seen[gid] = s.ts
            rows.append((gid, ts_ms, int(s.lost), *_gpu_metric_values(s), delta))
            self._note_minute(ts_ms)
        if rows:
            self.conn.executemany(self._insert_sample, rows)
        if lost_changes:
            # last_seen moves with the lost flag here; otherwise it is flushed once a minute.
            self.conn.executemany(
                "UPDATE gpus SET lost = ?, last_seen = max(last_seen, ?) WHERE id = ?", lost_changes
            )

    def _energy_delta(self, gid: int, ts_ms: int, energy: int) -> int | None:
        """The energy counted since this GPU's previous reading, or None where there is no new span."""
        prev = self._previous_energy(gid, ts_ms)
        if prev is None:
            self._last_energy[gid] = (ts_ms, energy)
            return None
        if ts_ms <= prev[0]:
            # A late or repeated sample (not newer than the last reading) gets no delta:
            # its energy is already inside the next reading's.
            return None
        self._last_energy[gid] = (ts_ms, energy)
        # A counter below its previous value was reset (driver reload): everything
        # it counted since the reset is new energy.
        return energy - prev[1] if energy >= prev[1] else energy

    def _write_processes(self, processes: list[GpuProcess], ts: float) -> None:
        scan_ms = _ms(ts)
        # Recorded even when the read found no process, so "the latest processes" are then none,
        # not an older read's.
        self.conn.execute("INSERT OR IGNORE INTO process_scans (ts) VALUES (?)", (scan_ms,))
        procs = [
            (scan_ms, self._gpu_id(p.uuid, ts), *(getattr(p, f) for f in _PROCESS_FIELDS)) for p in processes
        ]
        if procs:
            self.conn.executemany(self._insert_process, procs)

    def _fold(self, minutes: list[int]) -> None:
        """Aggregate the given closed minutes from raw rows, then re-aggregate their hours."""
        conn = self.conn
        gids = sorted(self._uuids)
        hours = sorted({_floor(m, HOUR_MS) for m in minutes})
        conn.executemany(self._fold_gpu_minutes, [(g, m, m + MINUTE_MS) for m in minutes for g in gids])
        conn.executemany(self._fold_gpu_hours, [(g, h, h + HOUR_MS) for h in hours for g in gids])
        conn.executemany(self._fold_host_minutes, [(m, m + MINUTE_MS) for m in minutes])
        conn.executemany(self._fold_host_hours, [(h, h + HOUR_MS) for h in hours])
        if self._seen:
            conn.executemany(
                "UPDATE gpus SET last_seen = max(last_seen, ?) WHERE id = ?",
                [(ts, gid) for gid, ts in self._seen.items()],
            )
            self._seen.clear()

    def _recover(self) -> None:
        """Fold the minutes that raw rows hold but the rollups do not (after a stop or crash)."""
        conn = self.conn
        self._recovered = True
        for gid in sorted(self._uuids):
            last = conn.execute("SELECT max(bucket) FROM samples_1m WHERE gpu_id = ?", (gid,)).fetchone()[0]
            newest = conn.execute("SELECT max(ts) FROM samples WHERE gpu_id = ?", (gid,)).fetchone()[0]
            if newest is None:
                continue
            lo = int(last) if last is not None else 0
            hi = _floor(int(newest), MINUTE_MS) + MINUTE_MS
            conn.execute(self._fold_gpu_minutes, (gid, lo, hi))
            lo_h = _floor(lo, HOUR_MS) if last is not None else 0
            conn.execute(self._fold_gpu_hours, (gid, lo_h, hi))
            row = conn.execute("SELECT lost FROM gpus WHERE id = ?", (gid,)).fetchone()
            self._lost[gid] = bool(row[0]) if row else False
        last = conn.execute("SELECT max(bucket) FROM host_samples_1m").fetchone()[0]
        newest = conn.execute("SELECT max(ts) FROM host_samples").fetchone()[0]
        if newest is not None:
            lo = int(last) if last is not None else 0
            hi = _floor(int(newest), MINUTE_MS) + MINUTE_MS
            conn.execute(self._fold_host_minutes, (lo, hi))
            conn.execute(self._fold_host_hours, (_floor(lo, HOUR_MS) if last is not None else 0, hi))

    def flush(self) -> None:
        """Fold the open minute now (e.g. on shutdown, so rollups are complete without a restart)."""
        with self._lock, self._transaction():
            if not self._recovered:
                self._recover()
            if self._open_minute is not None:
                self._dirty_minutes.add(self._open_minute)
            if self._dirty_minutes:
                self._fold(sorted(self._dirty_minutes))
                self._dirty_minutes.clear()

    # ------------------------------------------------------------------------------------- reads

    def gpus(self) -> list[dict[str, Any]]:
        """Static rows of every GPU ever seen: GpuStatic fields plus first_seen, last_seen, lost."""
        with self._lock:
            cur = self.conn.execute('SELECT * FROM gpus ORDER BY "index" IS NULL, "index", id')
            names = [d[0] for d in cur.description]
            out = []
            for row in cur.fetchall():
                d = dict(zip(names, row, strict=True))
                d.pop("id")
                d["unsupported"] = json.loads(d["unsupported"] or "[]")
                d["mig_mode"] = None if d["mig_mode"] is None else bool(d["mig_mode"])
                d["lost"] = bool(d["lost"])
                out.append(d)
            return out

    def latest(self, uuid: str | None = None) -> dict[str, GpuSample]:
        """The newest sample of each GPU (or of `uuid` only), keyed by UUID."""
        with self._lock:
            gids = self._resolve(None if uuid is None else [uuid])
            cols = ", ".join(("ts", "lost", *GPU_METRICS))
            out: dict[str, GpuSample] = {}
            for gid in gids:
                row = self.conn.execute(
                    f"SELECT {cols} FROM samples WHERE gpu_id = ? ORDER BY ts DESC LIMIT 1", (gid,)
                ).fetchone()
                if row is None:
                    continue
                u = self._uuids[gid]
                out[u] = GpuSample(
                    ts=row[0] / 1000,
                    uuid=u,
                    lost=bool(row[1]),
                    **dict(zip(GPU_METRICS, row[2:], strict=True)),
                )
            return out

    def latest_host(self) -> HostSample | None:
        """The newest host sample, or None when none was stored."""
        with self._lock:
            cols = ", ".join(("ts", *HOST_METRICS))
            row = self.conn.execute(f"SELECT {cols} FROM host_samples ORDER BY ts DESC LIMIT 1").fetchone()
            if row is None:
                return None
            return HostSample(ts=row[0] / 1000, **dict(zip(HOST_METRICS, row[1:], strict=True)))

    def oldest_process_read(self) -> float | None:
        """When the oldest process read still stored was made (retention drops older ones)."""
        with self._lock:
            row = self.conn.execute("SELECT min(ts) FROM process_scans").fetchone()
        return None if row[0] is None else row[0] / 1000

    def processes(
        self,
        latest_only: bool = True,
        uuid: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> list[GpuProcess]:
        """Processes from the latest process read, or (latest_only=False) every stored read in
        [since, until), oldest first, at most `limit` rows."""
        with self._lock:
            gids = self._resolve(None if uuid is None else [uuid])
            if not gids:
                return []
            marks = ", ".join("?" * len(gids))
            cols = "p.ts, p.gpu_id, " + ", ".join(f"p.{f}" for f in _PROCESS_FIELDS)
            if latest_only:
                sql = (
                    f"SELECT {cols} FROM gpu_processes p WHERE p.ts = (SELECT max(ts) FROM process_scans)"
                    f" AND p.gpu_id IN ({marks}) ORDER BY p.gpu_id, p.pid"
                )
                params: list[Any] = list(gids)
            else:
                sql = (
                    f"SELECT {cols} FROM gpu_processes p WHERE p.ts >= ? AND p.ts < ?"
                    f" AND p.gpu_id IN ({marks}) ORDER BY p.ts, p.gpu_id, p.pid LIMIT ?"
                )
                params = [
                    _ms(since) if since is not None else 0,
                    _ms(until) if until is not None else 2**62,
                    *gids,
                    -1 if limit is None else limit,
                ]
            out = []
            for row in self.conn.execute(sql, params).fetchall():
                values = dict(zip(_PROCESS_FIELDS, row[2:], strict=True))
                out.append(GpuProcess(ts=row[0] / 1000, uuid=self._uuids[row[1]], **values))
            return out

    # ----------------------------------------------------------------------------------- history

    def _first_ts(self, tier: _Tier, gids: list[int] | None) -> int | None:
        """Oldest timestamp a tier holds for these GPUs (host when `gids` is None)."""
        if gids is None:
            row = self.conn.execute(f"SELECT min({tier.ts_col}) FROM {tier.host_table}").fetchone()
            return None if row[0] is None else int(row[0])
        firsts = []
        for gid in gids:
            row = self.conn.execute(
                f"SELECT {tier.ts_col} FROM {tier.gpu_table} WHERE gpu_id = ? ORDER BY {tier.ts_col} LIMIT 1",
                (gid,),
            ).fetchone()
            if row is not None:
                firsts.append(int(row[0]))
        return min(firsts) if firsts else None

    def _pick_tier(self, span_ms: int, points: int, start_ms: int, gids: list[int] | None) -> _Tier:
        """The finest tier whose rows a point may aggregate cheaply and that still covers the window."""
        step = span_ms / points
        wanted = 0 if step < RAW_MAX_STEP_MS else 1 if step < MINUTE_MAX_STEP_MS else 2
        firsts = [self._first_ts(t, gids) for t in _TIERS]
        for i in range(wanted, len(_TIERS) - 1):
            first = firsts[i]
            coarser = [f for f in firsts[i + 1 :] if f is not None]
            if first is None:
                if not coarser:
                    return _TIERS[i]  # nothing anywhere: any tier gives the same empty answer
                continue
            # Covered when it reaches back to the window start, or when no coarser tier holds
            # older data than this one (allowing for the coarser bucket starting earlier).
            if first <= start_ms or not coarser or first < min(coarser) + HOUR_MS:
                return _TIERS[i]
        return _TIERS[-1]

    def _validate(
        self, metrics: Sequence[str], allowed: Sequence[str], start: float, end: float, points: int
    ) -> None:
        if not metrics:
            raise UserError(f"name at least one metric — choose from: {', '.join(allowed)}")
        bad = [m for m in metrics if m not in allowed]
        if bad:
            raise UserError(f"unknown metric {', '.join(bad)} — choose from: {', '.join(allowed)}")
        if not end > start:
            raise UserError(f"history window is empty: end ({end}) must be after start ({start})")
        if points < 1:
            raise UserError(f"points must be at least 1 (got {points})")

    def history(
        self, gpus: list[str] | None, metrics: list[str], start: float, end: float, points: int = 300
    ) -> History:
        """Series of `metrics` for `gpus` (None: all) over [start, end), in at most `points` buckets."""
        allowed = [*GPU_METRICS, ENERGY_METRIC]
        self._validate(metrics, allowed, start, end, points)
        with self._lock:
            gids = self._resolve(gpus)
            return self._history(gids, list(dict.fromkeys(metrics)), start, end, points)

    def host_history(self, metrics: list[str], start: float, end: float, points: int = 300) -> History:
        """Host series (under the key "host") over [start, end), in at most `points` buckets."""
        self._validate(metrics, HOST_METRICS, start, end, points)
        with self._lock:
            return self._history(None, list(dict.fromkeys(metrics)), start, end, points)

    def history_sql(self, tier: str, metrics: list[str], n_gpus: int, *, host: bool = False) -> str:
        """The SELECT a history query runs on `tier` (for EXPLAIN QUERY PLAN in tests and docs)."""
        t = {x.name: x for x in _TIERS}[tier]
        return self._history_select(t, metrics, None if host else n_gpus)

    def _history_select(self, tier: _Tier, metrics: list[str], n_gpus: int | None) -> str:
        """Per (gpu, bucket): for each metric sum, count, min, max (energy: the summed delta).

        Sums and counts rather than averages, so a bucket split between a rollup and the raw
        tail (the minute not yet folded) merges exactly.
        """
        ts = tier.ts_col
        parts: list[str] = []
        for m in metrics:
            if m == ENERGY_METRIC:
                parts.append("sum(energy_delta_mj)")
            elif tier is _RAW:
                parts += [f"sum({m})", f"count({m})", f"min({m})", f"max({m})"]
            else:
                parts += [f"sum({m}_sum)", f"sum({m}_n)", f"min({m}_min)", f"max({m}_max)"]
        if n_gpus is None:
            return (
                f"SELECT 0, ({ts} - ?) / ? AS b, {', '.join(parts)} FROM {tier.host_table}"
                f" WHERE {ts} >= ? AND {ts} < ? GROUP BY b"
            )
        marks = ", ".join("?" * n_gpus)
        return (
            f"SELECT gpu_id, ({ts} - ?) / ? AS b, {', '.join(parts)} FROM {tier.gpu_table}"
            f" WHERE gpu_id IN ({marks}) AND {ts} >= ? AND {ts} < ? GROUP BY gpu_id, b ORDER BY gpu_id, b"
        )

    def _folded_until(self, gids: list[int] | None) -> int | None:
        """End of the newest folded minute (rollups hold everything before it), None if none."""
        if gids is None:
            row = self.conn.execute("SELECT max(bucket) FROM host_samples_1m").fetchone()
            return None if row[0] is None else int(row[0]) + MINUTE_MS
        newest = [
            self.conn.execute("SELECT max(bucket) FROM samples_1m WHERE gpu_id = ?", (gid,)).fetchone()[0]
            for gid in gids
        ]
        found = [int(x) for x in newest if x is not None]
        return max(found) + MINUTE_MS if found else None

    def _history(
        self, gids: list[int] | None, metrics: list[str], start: float, end: float, points: int
    ) -> History:
        start_ms, end_ms = _ms(start), _ms(end)
        span = max(end_ms - start_ms, 1)
        tier = self._pick_tier(span, points, start_ms, gids)
        # Buckets are whole multiples of the tier's width, aligned to it, so a rollup row never
        # straddles two points; the count of buckets stays within `points`.
        width = tier.width_ms
        q_start = _floor(start_ms, width)
        step = max(_ceil(math.ceil((end_ms - q_start) / points), width), width)
        keys = ["host"] if gids is None else [self._uuids[g] for g in gids]
        result = History(tier=tier.name, step=step / 1000, start=start, end=end)
        result.series = {k: {m: [] for m in metrics} for k in keys}
        if gids is not None and not gids:
            return result
        acc, merged = self._history_buckets(tier, gids, metrics, q_start, step, end_ms)
        layout = _row_layout(metrics)
        names = {0: "host"} if gids is None else {g: self._uuids[g] for g in gids}
        for gid, b in sorted(acc) if merged else acc:
            _append_points(result.series[names[gid]], layout, (q_start + b * step) / 1000, acc[(gid, b)])
        return result

    def _history_buckets(
        self,
        tier: _Tier,
        gids: list[int] | None,
        metrics: list[str],
        q_start: int,
        step: int,
        end_ms: int,
    ) -> tuple[dict[tuple[int, int], Sequence[Any]], bool]:
        """(gpu_id, bucket) -> the row's values (per metric sum, count, min, max; energy one sum),
        and whether raw rows added buckets the tier lacked (then they are no longer in order)."""
        ids = gids or []
        n = None if gids is None else len(gids)
        acc: dict[tuple[int, int], Sequence[Any]] = {}
        ranges: list[tuple[_Tier, int, int]] = [(tier, q_start, end_ms)]
        if tier is not _RAW:
            # The open minute reaches the rollups when it closes: read it (and anything else not
            # folded yet) from the raw rows, bucketed the same way.
            folded = self._folded_until(gids)
            tail = q_start if folded is None else max(folded, q_start)
            ranges = [(tier, q_start, min(end_ms, tail)), (_RAW, tail, end_ms)]
        merged = False
        for t, lo, hi in ranges:
            if lo >= hi:
                continue
            sql = self._history_select(t, metrics, n)
            for row in self.conn.execute(sql, [q_start, step, *ids, lo, hi]):
                key = (row[0], row[1])
                have = acc.get(key)
                if have is None:
                    acc[key] = row[2:]
                    merged = merged or t is not tier
                else:
                    acc[key] = _merge(metrics, have, row[2:])
        return acc, merged

    def energy_between(self, uuid: str, start: float, end: float) -> float | None:
        """Energy (J) GPU `uuid` used in [start, end), counter resets handled; None without data.

        Raw rows answer where they still exist; older parts come from the 1-minute, then 1-hour
        rollups, at the precision of their buckets at the window's edges.
        """
        with self._lock:
            (gid,) = self._resolve([uuid])
            s, e = _ms(start), _ms(end)
            first_raw = self._first_ts(_RAW, [gid])
            first_min = self._first_ts(_MIN, [gid])
            first_hour = self._first_ts(_HOUR, [gid])
            # Tier boundaries on bucket edges, so each stretch of time is counted by one tier only.
            # A tier whose start no coarser tier predates is complete from its first bucket; one
            # that retention trimmed starts at its first whole bucket (the coarser tier has the
            # partial one).
            far = max(e, 0) + HOUR_MS
            if first_raw is None:
                raw_from = far
            elif first_min is None or first_min >= _floor(first_raw, MINUTE_MS):
                raw_from = _floor(first_raw, MINUTE_MS)
            else:
                raw_from = _ceil(first_raw, MINUTE_MS)
            if first_min is None:
                min_from = raw_from
            elif first_hour is None or first_hour >= _floor(first_min, HOUR_MS):
                min_from = _floor(first_min, HOUR_MS)
            else:
                min_from = _ceil(first_min, HOUR_MS)
            if min_from > raw_from:
                min_from = _floor(raw_from, HOUR_MS)
            total: float | None = None
            for sql, lo, hi in (
                (
                    "SELECT sum(energy_delta_mj) FROM samples WHERE gpu_id = ? AND ts >= ? AND ts < ?",
                    max(s, raw_from),
                    e,
                ),
                (
                    "SELECT sum(energy_delta_mj) FROM samples_1m"
                    " WHERE gpu_id = ? AND bucket >= ? AND bucket < ?",
                    max(s, min_from),
                    min(e, raw_from),
                ),
                (
                    "SELECT sum(energy_delta_mj) FROM samples_1h"
                    " WHERE gpu_id = ? AND bucket >= ? AND bucket < ?",
                    s,
                    min(e, min_from),
                ),
            ):
                if lo >= hi:
                    continue
                value = self.conn.execute(sql, (gid, lo, hi)).fetchone()[0]
                if value is not None:
                    total = (total or 0.0) + value / 1000
            return total

    # ------------------------------------------------------------------------------ maintenance

    def enforce_retention(
        self,
        now: float,
        raw_hours: float = 48,
        minute_days: float = 30,
        hour_days: float = 365,
        chunk_rows: int = 5000,
    ) -> int:
        """Delete rows older than each tier's retention, in chunks of `chunk_rows`; rows deleted.

        Each chunk is its own short transaction, so the sampler's ticks interleave with a large
        clean-up instead of waiting behind it. Cut-offs fall on the next-coarser bucket edge, so
        a tier never keeps half of a bucket that a coarser tier summarises whole.
        """
        if chunk_rows < 1:
            raise UserError(f"chunk_rows must be at least 1 (got {chunk_rows})")
        now_ms = _ms(now)
        raw_cut = _floor(now_ms - round(raw_hours * HOUR_MS), MINUTE_MS)
        min_cut = _floor(now_ms - round(minute_days * 24 * HOUR_MS), HOUR_MS)
        hour_cut = _floor(now_ms - round(hour_days * 24 * HOUR_MS), HOUR_MS)
        with self._lock:
            self._load_ids()
            gids = sorted(self._uuids)
        jobs = _retention_jobs(gids, raw_cut, min_cut, hour_cut, chunk_rows)
        deleted = 0
        for sql, params in jobs:
            while True:
                with self._lock, self._transaction():
                    n = self.conn.execute(sql, params).rowcount
                deleted += n
                if n < chunk_rows:
                    break
        return deleted

    def optimize(self) -> None:
        """Refresh planner statistics (bounded ANALYZE): a rollup query scanned until stats existed."""
        with self._lock:
            # analysis_limit keeps ANALYZE to milliseconds on large tables; approximate stats suffice.
            self.conn.execute("PRAGMA analysis_limit = 1000")
            self.conn.execute("ANALYZE")
            self.conn.execute("PRAGMA optimize")
