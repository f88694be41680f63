"""Runs under the systemd unit start in scopes of their own (see daemon/process.py)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.daemon.process import in_own_scope


def test_runs_get_their_own_systemd_scope_only_under_systemd(tmp_path: Path) -> None:
    """Under the systemd unit (KillMode=mixed) a run must not share the daemon's cgroup."""

    fake = tmp_path / "systemd-run"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    argv = ["python", "-m", "gpuwarden.runners"]
    assert in_own_scope(argv, "gpuwarden-run-r1-1", {"PATH": str(tmp_path)}) == argv  # not a systemd service
    assert in_own_scope(argv, "u", {"PATH": "/nonexistent", "INVOCATION_ID": "x"}) == argv  # no systemd-run
    wrapped = in_own_scope(argv, "gpuwarden-run-r1-1", {"PATH": str(tmp_path), "INVOCATION_ID": "abc"})
    assert wrapped[:6] == [
        str(fake),
        "--user",
        "--scope",
        "--quiet",
        "--collect",
        "--unit=gpuwarden-run-r1-1",
    ]
    assert wrapped[6:] == ["--", *argv]
