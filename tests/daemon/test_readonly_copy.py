"""A database browsed where it cannot be written: a backup copied to a read-only folder or mount."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.daemon.conftest import FINAL, DaemonHandle, command_spec


@pytest.fixture
def read_only_folder(short_tmp: Path) -> Iterator[tuple[Path, Path]]:
    """(where files go in, the same folder seen read-only)."""
    source, view = short_tmp / "backup", short_tmp / "ro"
    source.mkdir()
    view.mkdir()
    if os.geteuid() != 0:
        yield source, source  # made read-only by mode once filled
        source.chmod(0o755)
        return
    if shutil.which("mount") is None:
        pytest.skip("root without mount(8): cannot make a read-only folder")
    bind = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True)
    if bind.returncode != 0:
        pytest.skip("root without CAP_SYS_ADMIN: cannot make a read-only folder")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield source, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_a_backup_in_a_read_only_folder_opens(gw: DaemonHandle, read_only_folder: tuple[Path, Path]) -> None:
    run = gw.submit(command_spec("backed-up", "print('done')", resources={"gpus": 0}))
    gw.wait_state(run["id"], FINAL)
    source, view = read_only_folder
    with closing(sqlite3.connect(gw.db)) as live, closing(sqlite3.connect(source / "gpuwarden.db")) as copy:
        live.backup(copy)  # what `sqlite3 gpuwarden.db .backup` writes: one file, still in WAL mode
    assert not (source / "gpuwarden.db-wal").exists()
    if view == source:
        source.chmod(0o555)
    result = gw.cli("report", run["id"], "--db", str(view / "gpuwarden.db"))
    assert result.returncode == 0, result.stderr
    assert "backed-up" in result.stdout
