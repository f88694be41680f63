"""A database the daemon cannot write (a real `chattr +i` where the filesystem has it): one line
that names what is wrong, never a daemon bug."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonHandle

Freeze = Callable[..., None]


@pytest.fixture
def freeze(short_tmp: Path) -> Iterator[Freeze]:
    """`freeze(path, …)`: make files or folders immutable (even to root) until `thaw` or the
    test's end."""
    probe = short_tmp / "probe"
    probe.touch()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)]).returncode:
        pytest.skip("needs chattr +i (root, on a filesystem with the immutable flag: ext4, xfs, btrfs)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    frozen: list[Path] = []

    def freeze(*paths: Path) -> None:
        subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
        frozen.extend(paths)

    freeze.thaw = lambda: _thaw(frozen)  # type: ignore[attr-defined]
    try:
        yield freeze
    finally:
        _thaw(frozen)


def _thaw(frozen: list[Path]) -> None:
    for path in frozen:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    frozen.clear()


def _refusal(gw: DaemonHandle) -> tuple[str, str]:
    """What `up` and `daemon` print when they cannot start."""
    up = gw.cli("up")
    assert up.returncode == 2 and up.stderr.count("\n") == 1, up.stderr
    with contextlib.suppress(subprocess.TimeoutExpired):
        foreground = gw.cli("daemon", timeout=30)
        assert foreground.returncode == 2, foreground.stderr
        return up.stderr, foreground.stderr.splitlines()[-1] + "\n"
    raise AssertionError("`gpuwarden daemon` started on a database it cannot write")


def test_up_on_an_immutable_database_says_it_cannot_be_written(gw: DaemonHandle, freeze: Freeze) -> None:
    gw.stop()
    freeze(gw.db)
    for said in _refusal(gw):
        assert said.startswith(f"gpuwarden: {gw.db}: cannot be written (marked immutable) — "), said
        assert f"chattr -i {gw.db}" in said and "cannot create" not in said, said
