"""Schema versions: an older telemetry database migrates forward with its rows; newer ones refuse."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.store.db import open_db, schema_version
from gpuwarden.core.store.migrations import SCHEMA_VERSION
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GpuSample, Tick

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000.0


def make_db(path: Path, script: str, user_version: int) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {user_version}")
    conn.commit()
    conn.close()


def test_v1_database_migrates_forward_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    make_db(path, (FIXTURES / "telemetry_v1.sql").read_text(), user_version=1)
    db = open_db(path)
    assert schema_version(db) == SCHEMA_VERSION
    assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 20
    store = TelemetryStore(db)
    assert [g["uuid"] for g in store.gpus()] == ["GPU-fixture-0", "GPU-fixture-1"]
    latest = store.latest()
    assert latest["GPU-fixture-1"].util_gpu == 91.0 and latest["GPU-fixture-1"].ts == T0 + 180
    assert store.latest_host() is not None
    assert [p.pid for p in store.processes()] == [4242]
    h = store.history(None, ["util_gpu", "energy_j"], T0, T0 + 200, points=300)
    assert h.tier == "raw" and len(h.series["GPU-fixture-0"]["util_gpu"]) == 10
    assert store.energy_between("GPU-fixture-0", T0, T0 + 200) == pytest.approx(18.0)
    # The migrated database takes new ticks, continuing the energy counter it already had.
    store.write_tick(
        Tick(ts=T0 + 300, gpus=[GpuSample(ts=T0 + 300, uuid="GPU-fixture-0", energy_mj=1_030_000)])
    )
    assert store.energy_between("GPU-fixture-0", T0, T0 + 400) == pytest.approx(30.0)
    db.conn.close()


def test_unversioned_database_with_foreign_tables_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    make_db(path, "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');", user_version=0)
    db = open_db(path)
    assert schema_version(db) == SCHEMA_VERSION
    assert {"gpus", "samples", "samples_1m", "samples_1h", "host_samples", "gpu_processes"} <= set(
        db.table_names()
    )
    assert db.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
    db.conn.close()


def test_failed_migration_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "clash.db"
    # A table named like one of ours makes v1 fail halfway: nothing of it may stay behind.
    make_db(path, "CREATE TABLE samples_1h (x INTEGER);", user_version=0)
    with pytest.raises(
        UserError, match=r"clash\.db: not a usable gpuwarden database \(table samples_1h already"
    ):
        open_db(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names == {"samples_1h"}
    conn.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_newer_database_is_a_one_line_user_error(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "new.db"
    make_db(path, "CREATE TABLE future (x);", user_version=SCHEMA_VERSION + 7)
    with pytest.raises(UserError) as info:
        open_db(path, readonly=readonly)
    message = str(info.value)
    assert "newer" in message and "\n" not in message
