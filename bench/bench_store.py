"""Telemetry store: ingest rate against plain sqlite3, and history latency on a 30-day database.

1. Ingest: `TelemetryStore.write_tick` (8 GPUs + host, one transaction per tick, rollups folded as
   minutes close, energy deltas) against plain `executemany` of the very same raw rows into the
   same schema, one transaction per tick. Target: store ≥ 0.5 × raw rows/s.
2. History: 7-day window, 8 GPUs, 300 points on the database a daemon holds after 30 days at 1 Hz
   (retention keeps raw for 48 h, 1-minute rollups 30 days, hourly a year), built directly in SQL
   rather than by 20 M ticks. Target: median ≤ 50 ms, and ≤ 1.5 × the same query on a database
   holding one day. That database holds a seventh of the window's rows, so the ratio is reported
   as asked and next to it the like-for-like one: a 24-hour window, which both hold whole. The
   24-hour (1-minute tier) and 1-hour (raw tier) latencies are reported too.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlite_utils

from bench.figures import REPEATS, figure_row, main_for, paired_ratios
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.schema_telemetry import GPU_AFFINITY, HOUR_MS, MINUTE_MS
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GPU_METRICS, HOST_METRICS, GpuSample, GpuStatic, HostSample, Tick

GPUS = 8
INGEST_TICKS = 3000  # 50 minutes of 1 Hz ticks: includes 50 minute folds and an hour fold
HISTORY_METRICS = ["util_gpu", "mem_used", "power_w", "energy_j"]  # a typical dashboard panel
HISTORY_RUNS = 15
NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC
T0 = NOW - 30 * 86400

# SQL expressions producing plausible values per metric (random, so rows are no smaller than real).
_RAW_EXPR = {
    "util_gpu": "abs(random()) % 101",
    "util_mem": "abs(random()) % 101",
    "util_gpu_fine": "(abs(random()) % 10001) / 100.0",
    "mem_used": "abs(random()) % 85000000000",
    "mem_total": "85520809984",
    "power_w": "60 + (abs(random()) % 64000) / 100.0",
    "power_limit_w": "700.0",
    "energy_mj": "NULL",  # filled below from the tick number: a rising counter
    "temperature_c": "30 + abs(random()) % 55",
    "sm_clock_mhz": "1980",
    "mem_clock_mhz": "2619",
    "throttle_reasons": "(abs(random()) % 4) * 4",
    "fan_pct": "NULL",
    "pstate": "0",
    "pcie_tx_bps": "abs(random()) % 20000000000",
    "pcie_rx_bps": "abs(random()) % 20000000000",
}


def _gpus(store: TelemetryStore) -> list[str]:
    uuids = [f"GPU-{i:08x}-bench" for i in range(GPUS)]
    store.upsert_gpus(
        [GpuStatic(uuid=u, index=i, name="NVIDIA H100 80GB HBM3") for i, u in enumerate(uuids)], T0
    )
    return uuids


def _make_ticks(uuids: list[str], start: float, n: int) -> list[Tick]:
    rng = random.Random(7)
    ticks = []
    for k in range(n):
        ts = start + k
        samples = [
            GpuSample(
                ts=ts,
                uuid=u,
                util_gpu=float(rng.randint(0, 100)),
                util_mem=float(rng.randint(0, 100)),
                util_gpu_fine=rng.random() * 100,
                mem_used=rng.randint(0, 85_000_000_000),
                mem_total=85_520_809_984,
                power_w=60 + rng.random() * 640,
                power_limit_w=700.0,
                energy_mj=1_000_000 + 400_000 * k,
                temperature_c=float(rng.randint(30, 85)),
                sm_clock_mhz=1980,
                mem_clock_mhz=2619,
                throttle_reasons=rng.choice((0, 4)),
                pstate=0,
                pcie_tx_bps=float(rng.randint(0, 20_000_000_000)),
                pcie_rx_bps=float(rng.randint(0, 20_000_000_000)),
            )
            for u in uuids
        ]
        host = HostSample(
            ts=ts, cpu_percent=rng.random() * 100, mem_used=8 << 30, mem_total=32 << 30, load1=1.0
        )
        ticks.append(Tick(ts=ts, gpus=samples, host=host))
    return ticks


def _raw_rows(ticks: list[Tick], ids: dict[str, int]) -> list[tuple[list[tuple[Any, ...]], tuple[Any, ...]]]:
    """The rows the store writes for each tick (GPU rows with energy deltas, host row)."""
    out = []
    last: dict[str, int] = {}
    for t in ticks:
        rows = []
        for s in t.gpus:
            e = s.energy_mj
            delta = None if e is None or s.uuid not in last else e - last[s.uuid]
            if e is not None:
                last[s.uuid] = e
            rows.append((ids[s.uuid], round(s.ts * 1000), 0, *(getattr(s, m) for m in GPU_METRICS), delta))
        assert t.host is not None
        host = (round(t.host.ts * 1000), *(getattr(t.host, m) for m in HOST_METRICS))
        out.append((rows, host))
    return out


def bench_ingest(tmp: Path) -> list[dict[str, Any]]:
    store_rates: list[float] = []
    raw_rates: list[float] = []
    for rep in range(REPEATS):  # alternate the two, so a busy moment weighs on both
        db = open_db(tmp / f"ingest-store-{rep}.db")
        store = TelemetryStore(db)
        uuids = _gpus(store)
        ticks = _make_ticks(uuids, T0 + 3600 - 30, INGEST_TICKS)
        ids = dict(db.execute("SELECT uuid, id FROM gpus").fetchall())
        raw = _raw_rows(ticks, ids)
        start = time.perf_counter()
        for t in ticks:
            store.write_tick(t)
        store_rates.append(INGEST_TICKS * GPUS / (time.perf_counter() - start))
        db.conn.close()

        db = open_db(tmp / f"ingest-raw-{rep}.db")
        _gpus(TelemetryStore(db))
        conn = db.conn
        cols = ["gpu_id", "ts", "lost", *GPU_METRICS, "energy_delta_mj"]
        insert = f"INSERT INTO samples ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        host_cols = ["ts", *HOST_METRICS]
        insert_host = (
            f"INSERT INTO host_samples ({', '.join(host_cols)}) VALUES ({', '.join('?' * len(host_cols))})"
        )
        start = time.perf_counter()
        for rows, host in raw:
            conn.execute("BEGIN")
            conn.executemany(insert, rows)
            conn.execute(insert_host, host)
            conn.execute("COMMIT")
        raw_rates.append(INGEST_TICKS * GPUS / (time.perf_counter() - start))
        db.conn.close()
    return [
        figure_row("ingest: store write_tick (8 GPUs + host, 1 txn/tick, rollups)", store_rates, "rows/s"),
        figure_row(
            "ingest: plain sqlite3 executemany, same rows and schema, 1 txn/tick", raw_rates, "rows/s"
        ),
        figure_row(
            "ingest: store / plain sqlite3",
            paired_ratios(store_rates, raw_rates),
            "×",
            target="≥ 0.5",
            check=lambda v: v >= 0.5,
        ),
        figure_row("ingest: store time per 8-GPU tick", [1e6 * GPUS / r for r in store_rates], "µs"),
    ]


def _rollup_select(width_ms: int, count: int) -> str:
    """Synthetic rollup rows: per metric sum/min/max/n around a random value."""
    parts = []
    for m, aff in GPU_AFFINITY.items():
        v = _RAW_EXPR[m]
        if v == "NULL":
            parts += ["NULL", "NULL", "NULL", "0"]
            continue
        cast = "CAST({} AS INTEGER)" if aff == "INTEGER" else "{}"
        parts += [f"({v}) * {count}", cast.format(f"({v}) / 2"), cast.format(v), str(count)]
    return ", ".join(parts)


def build_db(path: Path, days: float) -> sqlite_utils.Database:
    """A daemon's database after `days` at 1 Hz for 8 GPUs, as retention leaves it."""
    db = open_db(path)
    store = TelemetryStore(db)
    _gpus(store)
    conn = db.conn
    end_ms = round(NOW * 1000)
    start_ms = end_ms - round(days * 86400 * 1000)
    raw_start = max(start_ms, end_ms - 48 * HOUR_MS)
    metrics = ", ".join(GPU_METRICS)
    values = ", ".join(_RAW_EXPR[m] if m != "energy_mj" else "1000000 + 400000 * k" for m in GPU_METRICS)
    conn.execute("BEGIN")
    conn.execute(
        f"WITH RECURSIVE t(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM t WHERE k + 1 < ?) "
        f"INSERT INTO samples (gpu_id, ts, lost, {metrics}, energy_delta_mj) "
        f"SELECT g.id, ? + k * 1000, 0, {values}, CASE WHEN k = 0 THEN NULL ELSE 400000 END "
        f"FROM gpus g, t ORDER BY g.id, k",
        ((end_ms - raw_start) // 1000, raw_start),
    )
    for table, width in (("samples_1m", MINUTE_MS), ("samples_1h", HOUR_MS)):
        per = width // 1000
        cols = ", ".join(f"{m}_{p}" for m in GPU_METRICS for p in ("sum", "min", "max", "n"))
        conn.execute(
            f"WITH RECURSIVE t(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM t WHERE k + 1 < ?) "
            f"INSERT INTO {table} (gpu_id, bucket, n, lost_n, {cols}, energy_delta_mj) "
            f"SELECT g.id, ? + k * {width}, {per}, 0, {_rollup_select(width, per)}, {400000 * per} "
            f"FROM gpus g, t ORDER BY g.id, k",
            ((end_ms - start_ms) // width, start_ms),
        )
    conn.execute("COMMIT")
    # A daemon's WAL is checkpointed every 1000 pages; one bulk transaction leaves it huge instead.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.optimize()  # the daemon refreshes planner statistics periodically
    return db


def _query_ms(store: TelemetryStore, window_s: float) -> tuple[float, str, int]:
    start = time.perf_counter()
    h = store.history(None, HISTORY_METRICS, NOW - window_s, NOW, points=300)
    elapsed = (time.perf_counter() - start) * 1000
    points = max(len(s) for metrics in h.series.values() for s in metrics.values())
    return elapsed, h.tier, points


def _compare(
    big: TelemetryStore, small: TelemetryStore, window_s: float
) -> tuple[list[float], list[float], str]:
    """Query times (ms) on both databases, alternating; and the big one's tier and points."""
    on_big: list[float] = []
    on_small: list[float] = []
    what = ""
    for _ in range(HISTORY_RUNS):
        ms, tier, points = _query_ms(big, window_s)
        on_big.append(ms)
        on_small.append(_query_ms(small, window_s)[0])
        what = f"tier {tier}, {points} points"
    return on_big, on_small, what


def bench_history(tmp: Path) -> list[dict[str, Any]]:
    big = build_db(tmp / "history-30d.db", 30)
    small = build_db(tmp / "history-1d.db", 1)
    big_store, small_store = TelemetryStore(big), TelemetryStore(small)
    week_big, week_small, what = _compare(big_store, small_store, 7 * 86400)
    day_big, day_small, day_what = _compare(big_store, small_store, 86400)
    hour_big, _, hour_what = _compare(big_store, small_store, 3600)
    big.conn.close()
    small.conn.close()
    return [
        figure_row(
            f"history 7 d, 8 GPUs, {len(HISTORY_METRICS)} metrics, ≤300 points, 30-day DB ({what})",
            week_big,
            "ms",
            target="≤ 50",
            check=lambda v: v <= 50,
        ),
        # The 1-day database holds a seventh of the window's rows: this ratio measures the data
        # in the window, not the database's size (see the 24 h like-for-like ratio).
        figure_row(
            "history 7 d: 30-day DB / 1-day DB (1/7 of the rows in window)",
            paired_ratios(week_big, week_small),
            "×",
            target="≤ 1.5",
            check=lambda v: v <= 1.5,
        ),
        # Like for like: a window both databases hold whole, so only the database's size differs.
        figure_row(f"history 24 h, 8 GPUs, 30-day DB ({day_what})", day_big, "ms"),
        figure_row(
            "history 24 h: 30-day DB / 1-day DB (same rows in window)",
            paired_ratios(day_big, day_small),
            "×",
            target="≤ 1.5",
            check=lambda v: v <= 1.5,
        ),
        figure_row(f"history 1 h, 8 GPUs, 30-day DB ({hour_what})", hour_big, "ms"),
    ]


def run() -> list[dict[str, Any]]:
    """Run both benchmarks in a temporary directory; rows for the bench table."""
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-store-") as tmp:
        return bench_ingest(Path(tmp)) + bench_history(Path(tmp))


if __name__ == "__main__":
    raise SystemExit(main_for(run))
