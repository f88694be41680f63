"""Runs under the systemd unit start in scopes of their own (see daemon/process.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.daemon.process import in_own_scope, spawn


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


def test_a_scoped_run_reaches_the_service_manager_even_from_a_bare_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's environment is its submitter's; one from `sudo -u` lacks the session bus, which
    # systemd-run needs: the daemon's own is given where the run has none.
    seen = tmp_path / "env.txt"
    fake = tmp_path / "systemd-run"
    fake.write_text(f'#!/bin/sh\nenv > "{seen}"\nshift 6\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("INVOCATION_ID", "abc")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/4242/bus")
    submitter = {"PATH": os.environ["PATH"], "FOO": "bar", "XDG_RUNTIME_DIR": "/run/user/mine"}
    child = spawn(["true"], submitter, tmp_path, tmp_path / "out.log", tmp_path / "err.log", scope_unit="u")
    assert child.popen is not None and child.popen.wait(timeout=30) == 0
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/run/user/4242/bus"  # the daemon's
    assert env["XDG_RUNTIME_DIR"] == "/run/user/mine" and env["FOO"] == "bar"  # the run's own kept
