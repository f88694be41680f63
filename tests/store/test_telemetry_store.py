"""TelemetryStore: ticks, rollups, history tiers, energy, retention, query plans."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.schema_telemetry import HOUR_MS, MINUTE_MS, migrate_v1
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import (
    GpuProcess,
    GpuSample,
    GpuStatic,
    HostSample,
    Tick,
)

T0 = 1_700_000_000.0  # 22:13:20 UTC: deliberately not on a minute or hour edge


def fresh_db(path: str = ":memory:") -> sqlite_utils.Database:
    """A database holding only the telemetry schema, opened the way the daemon opens its own."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    db = sqlite_utils.Database(conn)
    conn.execute("BEGIN")
    migrate_v1(db)
    conn.execute("COMMIT")
    return db


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TelemetryStore]:
    db = fresh_db(str(tmp_path / "t.db"))
    yield TelemetryStore(db)
    db.conn.close()


def sample(ts: float, uuid: str = "GPU-a", **values: object) -> GpuSample:
    return GpuSample(ts=ts, uuid=uuid, **values)  # type: ignore[arg-type]


def tick(ts: float, samples: list[GpuSample], **kw: object) -> Tick:
    return Tick(ts=ts, gpus=samples, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- rollups

values_or_null = st.one_of(st.none(), st.integers(min_value=0, max_value=100))
series_strategy = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3 * 3600),  # offset in seconds: spans a few hours
        st.sampled_from(["GPU-a", "GPU-b"]),
        values_or_null,
        values_or_null,
        st.booleans(),
    ),
    min_size=1,
    max_size=120,
    unique_by=lambda r: (r[0], r[1]),
)


Buckets = dict[tuple[str, int], dict[str, tuple[Any, ...]]]


def expected_buckets(rows: list[tuple[int, str, int | None, int | None, bool]], width_ms: int) -> Buckets:
    """avg/min/max/non-null count per (uuid, bucket), computed in Python from the input."""
    out: Buckets = {}
    groups: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for offset, uuid, util, temp, lost in rows:
        ts_ms = round((T0 + offset) * 1000)
        groups.setdefault((uuid, ts_ms - ts_ms % width_ms), []).append((util, temp, lost))
    for key, members in groups.items():
        agg: dict[str, tuple[Any, ...]] = {}
        for i, name in enumerate(("util_gpu", "temperature_c")):
            vals = [m[i] for m in members if m[i] is not None]
            agg[name] = (
                sum(vals) / len(vals) if vals else None,
                min(vals) if vals else None,
                max(vals) if vals else None,
                len(vals),
            )
        agg["n"] = (len(members), sum(1 for m in members if m[2]), None, 0)
        out[key] = agg
    return out


def stored_buckets(store: TelemetryStore, table: str) -> Buckets:
    """The same figures read back from a rollup table."""
    names = dict(store.db.execute("SELECT id, uuid FROM gpus").fetchall())
    out: Buckets = {}
    for row in store.db.execute(
        f"SELECT gpu_id, bucket, n, lost_n, util_gpu_sum, util_gpu_min, util_gpu_max, util_gpu_n,"
        f" temperature_c_sum, temperature_c_min, temperature_c_max, temperature_c_n FROM {table}"
    ).fetchall():
        gid, bucket, n, lost_n, us, umin, umax, un, ts_, tmin, tmax, tn = row
        out[(names[gid], bucket)] = {
            "util_gpu": (us / un if un else None, umin, umax, un),
            "temperature_c": (ts_ / tn if tn else None, tmin, tmax, tn),
            "n": (n, lost_n, None, 0),
        }
    return out


def _rounded(buckets: Buckets) -> Buckets:
    """Averages rounded, so float summation order does not matter."""
    return {
        key: {
            name: tuple(round(v, 9) if isinstance(v, float) else v for v in agg)
            for name, agg in value.items()
        }
        for key, value in buckets.items()
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=series_strategy, shuffle=st.booleans())
def test_rollups_equal_aggregates_of_raw_rows(rows, shuffle) -> None:  # type: ignore[no-untyped-def]
    db = fresh_db()
    store = TelemetryStore(db)
    ordered = sorted(rows) if not shuffle else rows  # unsorted input: late samples re-fold their minute
    for offset, uuid, util, temp, lost in ordered:
        ts = T0 + offset
        s = sample(ts, uuid, lost=lost, util_gpu=None if util is None else float(util), temperature_c=temp)
        store.write_tick(tick(ts, [s]))
    store.flush()
    for table, width in (("samples_1m", MINUTE_MS), ("samples_1h", HOUR_MS)):
        assert _rounded(stored_buckets(store, table)) == _rounded(expected_buckets(ordered, width)), table
    # And the rollups equal SQL aggregates straight from the stored raw rows.
    direct = db.execute(
        f"SELECT gpu_id, ts - ts % {MINUTE_MS} AS b, count(*), sum(util_gpu), count(util_gpu),"
        " min(temperature_c), max(temperature_c) FROM samples GROUP BY gpu_id, b ORDER BY gpu_id, b"
    ).fetchall()
    rolled = db.execute(
        "SELECT gpu_id, bucket, n, util_gpu_sum, util_gpu_n, temperature_c_min, temperature_c_max"
        " FROM samples_1m ORDER BY gpu_id, bucket"
    ).fetchall()
    assert rolled == direct
    db.conn.close()


def test_rollups_survive_a_restart_mid_minute(tmp_path: Path) -> None:
    path = str(tmp_path / "r.db")
    db = fresh_db(path)
    first = TelemetryStore(db)
    for k in range(90):  # 1.5 minutes: the second minute is still open when the "crash" comes
        first.write_tick(tick(T0 + k, [sample(T0 + k, util_gpu=float(k))]))
    db.conn.close()
    db = fresh_db_reopen(path)
    second = TelemetryStore(db)
    second.write_tick(tick(T0 + 600, [sample(T0 + 600, util_gpu=1.0)]))
    direct = db.execute(
        f"SELECT ts - ts % {MINUTE_MS} AS b, count(*), sum(util_gpu) FROM samples GROUP BY b ORDER BY b"
    ).fetchall()
    rolled = db.execute("SELECT bucket, n, util_gpu_sum FROM samples_1m ORDER BY bucket").fetchall()
    assert rolled == direct[:-1]  # everything but the minute that is open now
    db.conn.close()


def fresh_db_reopen(path: str) -> sqlite_utils.Database:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    return sqlite_utils.Database(conn)


# -------------------------------------------------------------------------------- transactions


def test_one_transaction_per_tick(store: TelemetryStore) -> None:
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    # 3 GPUs, host and processes; the tick at +60 s closes a minute and folds it in the same transaction.
    for k in (0, 1, 60):
        ts = T0 + k
        store.write_tick(
            tick(
                ts,
                [sample(ts, f"GPU-{i}", util_gpu=1.0) for i in range(3)],
                host=HostSample(ts=ts, cpu_percent=3.0),
                processes=[GpuProcess(ts=ts, uuid="GPU-0", pid=7)],
            )
        )
    store.conn.set_trace_callback(None)
    begins = [s for s in statements if s.startswith("BEGIN")]
    commits = [s for s in statements if s == "COMMIT"]
    assert len(begins) == 3 and len(commits) == 3


def test_failed_tick_leaves_nothing_behind(store: TelemetryStore) -> None:
    store.write_tick(tick(T0, [sample(T0, energy_mj=1000)]))
    no_pid = GpuProcess(ts=T0 + 1, uuid="GPU-a", pid=cast(int, None))  # violates NOT NULL mid-tick
    bad = tick(T0 + 1, [sample(T0 + 1, energy_mj=5000)], processes=[no_pid])
    with pytest.raises(sqlite3.IntegrityError):
        store.write_tick(bad)
    assert store.db.execute("SELECT count(*) FROM samples").fetchone()[0] == 1
    assert store.db.execute("SELECT count(*) FROM process_scans").fetchone()[0] == 0
    # The rolled-back energy reading must not become the base of the next delta.
    store.write_tick(tick(T0 + 2, [sample(T0 + 2, energy_mj=3000)]))
    assert store.energy_between("GPU-a", T0, T0 + 3) == pytest.approx(2.0)


# ------------------------------------------------------------------------------------ readings


def test_gpus_latest_and_processes(store: TelemetryStore) -> None:
    static = GpuStatic(
        uuid="GPU-a", index=0, name="H100", memory_total=80 << 30, mig_mode=False, unsupported=("fan_pct",)
    )
    store.upsert_gpus([static], T0)
    store.write_tick(
        tick(
            T0,
            [sample(T0, util_gpu=10.0, mem_used=5, throttle_reasons=0x4), sample(T0, "GPU-new", lost=True)],
            host=HostSample(ts=T0, cpu_percent=12.5, mem_used=7),
            processes=[GpuProcess(ts=T0, uuid="GPU-a", pid=11, name="python", used_memory=3)],
        )
    )
    store.write_tick(tick(T0 + 1, [sample(T0 + 1, util_gpu=20.0)], processes=[]))
    rows = {r["uuid"]: r for r in store.gpus()}
    assert rows["GPU-a"]["name"] == "H100" and rows["GPU-a"]["unsupported"] == ["fan_pct"]
    assert rows["GPU-a"]["mig_mode"] is False and rows["GPU-a"]["lost"] is False
    assert rows["GPU-new"]["lost"] is True and rows["GPU-new"]["name"] is None  # registered on the fly
    latest = store.latest()
    assert latest["GPU-a"].util_gpu == 20.0 and latest["GPU-a"].ts == T0 + 1
    assert latest["GPU-new"].lost is True
    assert isinstance(store.latest("GPU-a")["GPU-a"].util_gpu, float)
    host = store.latest_host()
    assert host is not None and host.cpu_percent == 12.5 and host.mem_used == 7
    assert store.processes() == []  # the latest read found none
    everything = store.processes(latest_only=False)
    assert [(p.uuid, p.pid, p.name, p.used_memory) for p in everything] == [("GPU-a", 11, "python", 3)]


def test_unknown_metric_and_gpu_are_user_errors(store: TelemetryStore) -> None:
    store.write_tick(tick(T0, [sample(T0, util_gpu=1.0)]))
    with pytest.raises(UserError, match=r"^unknown metric utilisation — choose from: util_gpu"):
        store.history(None, ["utilisation"], T0, T0 + 60)
    with pytest.raises(UserError, match="unknown GPU GPU-zzz"):
        store.history(["GPU-zzz"], ["util_gpu"], T0, T0 + 60)
    with pytest.raises(UserError):
        store.history(None, ["util_gpu"], T0, T0)
    with pytest.raises(UserError, match="cpu_percent"):
        store.host_history(["util_gpu"], T0, T0 + 60)


# ------------------------------------------------------------------------------------- history


def fill(store: TelemetryStore, start: float, end: float, every: float, gpus: int = 2) -> None:
    ts = start
    k = 0
    while ts < end:
        store.write_tick(
            tick(
                ts,
                [sample(ts, f"GPU-{i}", util_gpu=float(k % 100), energy_mj=1000 * k) for i in range(gpus)],
                host=HostSample(ts=ts, cpu_percent=float(k % 50)),
            )
        )
        ts += every
        k += 1
    store.flush()


@pytest.mark.parametrize(
    ("window_s", "tier"),
    [(300, "raw"), (3600, "raw"), (86400, "1m"), (7 * 86400, "1h"), (30 * 86400, "1h")],
)
def test_tier_choice_by_window(store: TelemetryStore, window_s: int, tier: str) -> None:
    now = T0 + 31 * 86400
    fill(store, now - 31 * 86400, now, every=3600, gpus=1)  # young enough that raw still covers all
    h = store.history(None, ["util_gpu"], now - window_s, now, points=300)
    assert h.tier == tier
    assert store.host_history(["cpu_percent"], now - window_s, now, 300).tier == tier


def test_tier_falls_back_where_retention_deleted_the_finer_one(store: TelemetryStore) -> None:
    now = T0 + 40 * 86400
    fill(store, T0, now, every=600, gpus=1)
    store.enforce_retention(now)  # raw: 48 h, 1m: 30 days, 1h: a year
    assert store.history(None, ["util_gpu"], now - 3600, now).tier == "raw"
    assert store.history(None, ["util_gpu"], now - 4 * 86400, now - 4 * 86400 + 3600).tier == "1m"
    assert store.history(None, ["util_gpu"], now - 35 * 86400, now - 34 * 86400).tier == "1h"
    h = store.history(None, ["util_gpu"], now - 4 * 86400, now - 4 * 86400 + 3600)
    # One sample per 10 minutes, in 1-minute buckets; rollup tiers answer at bucket precision, so
    # the sample at `end` (its minute starts before `end`) is included as well.
    assert len(h.series["GPU-0"]["util_gpu"]) == 7


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(points=st.integers(min_value=1, max_value=400), window=st.integers(min_value=10, max_value=3 * 86400))
def test_points_cap(store: TelemetryStore, points: int, window: int) -> None:
    if not store.gpus():
        fill(store, T0, T0 + 3 * 86400, every=97, gpus=2)
    end = T0 + 3 * 86400
    h = store.history(None, ["util_gpu", "energy_j"], end - window, end, points=points)
    for metrics in h.series.values():
        for series in metrics.values():
            assert len(series) <= points
            stamps = [p[0] for p in series]
            assert stamps == sorted(stamps)
    assert h.step * points >= window - 60  # buckets cover the window (rollup tiers align its start)


def test_history_values_match_raw(store: TelemetryStore) -> None:
    fill(store, T0, T0 + 600, every=1, gpus=2)
    h = store.history(["GPU-1"], ["util_gpu"], T0, T0 + 600, points=50)
    assert h.tier == "raw" and h.step == 12
    series = h.series["GPU-1"]["util_gpu"]
    assert len(series) == 50
    assert series[0] == pytest.approx((T0, 5.5, 0.0, 11.0))
    assert list(h.series) == ["GPU-1"]
    d = h.to_dict()
    assert d["tier"] == "raw" and d["series"]["GPU-1"]["util_gpu"][0][1] == pytest.approx(5.5)
    # The same window through the 1-minute rollups gives the same per-minute averages.
    m = store.history(["GPU-1"], ["util_gpu"], T0 + 40, T0 + 580, points=9)
    assert m.tier == "1m" and m.step == 60
    assert m.series["GPU-1"]["util_gpu"][0] == pytest.approx((T0 + 40, 69.5, 40.0, 99.0))


def test_rollup_history_includes_the_open_minute(store: TelemetryStore) -> None:
    # 61 minutes 30 s: the last half minute is not folded yet and must come from raw rows.
    for k in range(3690):
        ts = T0 + k
        store.write_tick(tick(ts, [sample(ts, util_gpu=1.0, energy_mj=10 * k)]))
    h = store.history(None, ["util_gpu", "energy_j"], T0, T0 + 3690, points=30)
    assert h.tier == "1m"
    total = sum(p[1] for p in h.series["GPU-a"]["energy_j"])
    assert total == pytest.approx(10 * 3689 / 1000)
    assert sum(1 for _ in h.series["GPU-a"]["util_gpu"]) <= 30


# -------------------------------------------------------------------------------------- energy


def test_energy_deltas_with_counter_reset(store: TelemetryStore) -> None:
    counters = [1000, 2000, 3000, 500, 1500, None, 2500]  # reset after 3000; a tick without a reading
    for k, c in enumerate(counters):
        store.write_tick(tick(T0 + k, [sample(T0 + k, energy_mj=c)]))
    deltas = [r[0] for r in store.db.execute("SELECT energy_delta_mj FROM samples ORDER BY ts").fetchall()]
    assert deltas == [None, 1000, 1000, 500, 1000, None, 1000]
    assert store.energy_between("GPU-a", T0, T0 + 10) == pytest.approx(4.5)
    assert store.energy_between("GPU-a", T0 + 3, T0 + 4) == pytest.approx(0.5)
    h = store.history(None, ["energy_j"], T0, T0 + 7, points=7)
    assert [p[1] for p in h.series["GPU-a"]["energy_j"]] == [1.0, 1.0, 0.5, 1.0, 1.0]
    assert store.energy_between("GPU-a", T0 - 100, T0 - 50) is None


def test_late_and_repeated_samples_do_not_count_energy_twice(store: TelemetryStore) -> None:
    for k, c in ((0, 1000), (2, 3000), (1, 2000), (2, 9999), (3, 4000)):  # +1 s late, +2 s repeated
        store.write_tick(tick(T0 + k, [sample(T0 + k, energy_mj=c)]))
    assert store.energy_between("GPU-a", T0, T0 + 10) == pytest.approx(3.0)
    assert store.latest()["GPU-a"].energy_mj == 4000
    assert store.db.execute(
        "SELECT energy_mj FROM samples WHERE ts = ?", (round((T0 + 2) * 1000),)
    ).fetchone() == (3000,)


def test_energy_between_uses_rollups_after_retention(store: TelemetryStore) -> None:
    now = T0 + 5 * 86400
    fill(store, T0, now, every=180, gpus=1)  # 1 J per 3 minutes
    before = store.energy_between("GPU-0", T0 + 3600, T0 + 2 * 3600)
    store.enforce_retention(now, raw_hours=48)
    after = store.energy_between("GPU-0", T0 + 3600, T0 + 2 * 3600)
    assert before is not None and after is not None
    assert after == pytest.approx(before, abs=1.0)  # bucket precision at the edges
    assert store.energy_between("GPU-0", T0, now) == pytest.approx((5 * 480 - 1) * 1.0)


# ----------------------------------------------------------------------------------- retention


def test_retention_deletes_exactly_the_expired_rows_in_chunks(store: TelemetryStore) -> None:
    now = T0 + 4 * 86400
    ts = T0
    while ts < now:
        store.write_tick(
            tick(
                ts,
                [sample(ts, f"GPU-{i}", util_gpu=1.0) for i in range(2)],
                host=HostSample(ts=ts, cpu_percent=1.0),
                processes=[GpuProcess(ts=ts, uuid="GPU-0", pid=1)],
            )
        )
        ts += 300
    store.flush()
    db = store.db
    raw_cut = int((now - 48 * 3600) * 1000)
    raw_cut -= raw_cut % MINUTE_MS
    min_cut = int((now - 2 * 86400) * 1000)
    min_cut -= min_cut % HOUR_MS

    def count(sql: str, *args: int) -> int:
        return int(db.execute(sql, args).fetchone()[0])

    expired = (
        count("SELECT count(*) FROM samples WHERE ts < ?", raw_cut)
        + count("SELECT count(*) FROM host_samples WHERE ts < ?", raw_cut)
        + count("SELECT count(*) FROM gpu_processes WHERE ts < ?", raw_cut)
        + count("SELECT count(*) FROM process_scans WHERE ts < ?", raw_cut)
        + count("SELECT count(*) FROM samples_1m WHERE bucket < ?", min_cut)
        + count("SELECT count(*) FROM host_samples_1m WHERE bucket < ?", min_cut)
    )
    kept_raw = count("SELECT count(*) FROM samples WHERE ts >= ?", raw_cut)
    per_gpu = [count("SELECT count(*) FROM samples WHERE gpu_id = ? AND ts < ?", g, raw_cut) for g in (1, 2)]
    hours = count("SELECT count(*) FROM samples_1h")
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    deleted = store.enforce_retention(now, raw_hours=48, minute_days=2, hour_days=365, chunk_rows=50)
    store.conn.set_trace_callback(None)
    assert deleted == expired > 0
    assert count("SELECT count(*) FROM samples WHERE ts < ?", raw_cut) == 0
    assert count("SELECT count(*) FROM samples") == kept_raw
    assert count("SELECT count(*) FROM samples_1m WHERE bucket < ?", min_cut) == 0
    assert count("SELECT count(*) FROM samples_1h") == hours  # a year: nothing expired
    deletes = [s for s in statements if s.startswith("DELETE FROM samples WHERE")]
    # Chunked: one bounded DELETE per 50 rows (plus the short one that finds the end), per GPU.
    assert len(deletes) == sum(n // 50 + 1 for n in per_gpu)
    assert sum(1 for s in statements if s.startswith("BEGIN")) == sum(
        1 for s in statements if s.startswith("DELETE")
    )
    assert store.enforce_retention(now, raw_hours=48, minute_days=2) == 0


# ---------------------------------------------------------------------------------- query plans


@pytest.mark.parametrize("analyzed", [False, True])
def test_history_queries_use_the_primary_key(store: TelemetryStore, analyzed: bool) -> None:
    fill(store, T0, T0 + 2 * 3600, every=10, gpus=3)
    if analyzed:
        store.optimize()
    for tier in ("raw", "1m", "1h"):
        for host in (False, True):
            sql = store.history_sql(tier, ["util_gpu" if not host else "cpu_percent"], 3, host=host)
            params = [0, 1000] + ([] if host else [1, 2, 3]) + [0, 2**40]
            plan = " | ".join(r[3] for r in store.db.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall())
            assert "SEARCH" in plan, plan
            assert "USING PRIMARY KEY" in plan or "USING INTEGER PRIMARY KEY" in plan, plan
            assert " SCAN samples" not in f" {plan}" and "SCAN host_samples" not in plan, plan
