"""Files in the user's config folder that exist but are broken: named in one line, never ignored."""

from __future__ import annotations

import os

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
