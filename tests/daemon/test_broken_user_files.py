"""Files in the user's config folder that exist but are broken: named in one line, never ignored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle

SPEC = """\
name: p
kind: command
policy: mine
resources: {gpus: 0}
command: {argv: ["true"]}
"""


@pytest.mark.parametrize("kind", ["directory", "dangling link", "fifo"])
def test_a_broken_policy_file_is_named_not_called_unknown(gw: DaemonHandle, kind: str) -> None:
    policies = gw.root / "config" / "gpuwarden" / "policies"
    policies.mkdir(parents=True)
    mine = policies / "mine.yaml"
    if kind == "directory":
        mine.mkdir()
    elif kind == "fifo":
        os.mkfifo(mine)
    else:
        mine.symlink_to(gw.root / "moved-away.yaml")
    result = gw.cli("run", str(gw.write_spec("p", SPEC)))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"policy: {mine}: " in result.stderr, result.stderr
    assert "unknown retune policy" not in result.stderr


def test_a_dangling_link_in_place_of_the_config_file_is_an_error(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    config = gw.root / "config" / "gpuwarden" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.symlink_to(gw.root / "dotfiles" / "gpuwarden.yaml")  # the target moved away
    for args in (["up"], ["status"]):
        result = gw.cli(*args)
        assert result.returncode == 2, result
        assert result.stderr == f"gpuwarden: {config}: no such file — check the path\n"
    assert not Path(gw.socket).exists()  # no daemon started on defaults the user did not choose


def test_a_file_in_place_of_the_state_folder_is_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    in_the_way = gw.root / "state-file"
    in_the_way.write_text("not a folder\n")
    result = gw.cli("up", env={"GPUWARDEN_PATHS__STATE_DIR": str(in_the_way)})
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"gpuwarden: paths.state_dir: cannot write {in_the_way} (File exists) — "
        "set paths.state_dir to a place you can write\n"
    )


def test_a_runtime_folder_too_deep_for_a_socket_is_one_line(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    deep = gw.root / ("d" * 100)
    result = gw.cli("up", env={"GPUWARDEN_PATHS__RUNTIME_DIR": str(deep)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"gpuwarden: paths.runtime_dir: the socket's path {deep / 'api.sock'} is "
    )
    assert "more than the 107 a Unix socket allows" in result.stderr
    assert "Traceback" not in (gw.root / "state" / "gpuwarden" / "daemon.log").read_text()


def test_a_folder_given_as_the_database_is_named_as_a_folder(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    folder = gw.root / "dbs"
    folder.mkdir()
    result = gw.cli("up", env={"GPUWARDEN_PATHS__DB": str(folder)})
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"gpuwarden: {folder} is a directory — set paths.db to the database file in it "
        f"({folder / 'gpuwarden.db'})\n"
    )
