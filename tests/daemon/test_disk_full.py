"""The disk under the database fills up while the daemon runs (a real tmpfs where one can be mounted)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle, wait_for

SPEC = """\
name: later
kind: command
resources: {gpus: 0}
command: {argv: ["true"]}
"""


@pytest.fixture
def small_disk(short_tmp: Path) -> Iterator[Path]:
    disk = short_tmp / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("needs mount(8) to mount a small tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root with CAP_SYS_ADMIN)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> None:
    with contextlib.suppress(OSError), (disk / "junk").open("wb") as junk:
        while True:
            junk.write(b"\0" * 65536)
            junk.flush()
            os.fsync(junk.fileno())


def test_a_full_disk_is_named_in_one_line_and_logged_not_a_daemon_bug(
    daemon_factory: Any, small_disk: Path
) -> None:
    db = small_disk / "gpuwarden.db"
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_PATHS__DB": str(db)})
    spec = str(gw.write_spec("later", SPEC))
    _fill(small_disk)

    def refused() -> subprocess.CompletedProcess[str] | None:
        result = gw.cli("run", spec)
        return result if result.returncode != 0 else None  # some writes fit until the WAL fills

    result = wait_for(refused, "a submit the full disk refuses")
    assert result is not None
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"gpuwarden: the daemon cannot write {db}: database or disk is full")
    assert "free space on that disk" in result.stderr
    wait_for(
        lambda: "samples are dropped and run updates are written once" in gw.log.read_text(), "a warning"
    )
    assert "Traceback" not in gw.log.read_text(), gw.log.read_text()[-6000:]

    (small_disk / "junk").unlink()
    assert gw.cli("run", spec).returncode == 0
