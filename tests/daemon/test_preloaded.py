"""The suite's forked `gpuwarden` commands behave as `python -m gpuwarden` started afresh: the same
output, exit status, folder and environment, signals and timeouts (`tests/preloaded.py`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import preloaded
from tests.daemon.conftest import DaemonHandle

GPUWARDEN = [sys.executable, "-m", "gpuwarden"]


@pytest.fixture(autouse=True)
def _forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the forked path, whatever the suite was asked to do."""
    monkeypatch.delenv("GPUWARDEN_TESTS_PRELOAD", raising=False)


@pytest.mark.parametrize(
    "args",
    [
        # the folder it runs in and the environment it was given are in the spec it prints
        ["run", "--print-spec", "--knob", "bs=4", "--role", "micro_batch=bs", "--", "python", "t.py", "{bs}"],
        ["run", "--knob", "bs=four", "--", "python", "t.py"],  # a one-line refusal, exit 2
        ["no-such-command"],  # a usage error
        ["--help"],
    ],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "s")}
    forked = preloaded.run([*GPUWARDEN, *args], env=env, cwd=tmp_path, timeout=60)
    fresh = subprocess.run(
        [*GPUWARDEN, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr


def test_a_forked_daemon_has_its_own_pid_environment_and_signals(daemon_factory: Any) -> None:
    """Started where its environment says, stopped by SIGTERM (exit 0, as a fresh one's) and
    killed by SIGKILL (-9, as `subprocess` says it)."""
    gw: DaemonHandle = daemon_factory(start=False)
    for sig, code in ((signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)):
        gw.start()
        assert gw.proc is not None and gw.proc.pid != os.getpid()
        with gw.client() as client:
            assert client.health().pid == gw.proc.pid
        assert gw.socket.is_socket() and gw.socket.is_relative_to(gw.env["XDG_RUNTIME_DIR"])
        gw.proc.send_signal(sig)
        assert gw.proc.wait(timeout=30) == code
    assert "gpuwarden daemon" in gw.log.read_text()


def test_a_timeout_raises_and_kills_the_child(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded.run([*GPUWARDEN, "daemon"], env=gw.env, cwd=gw.root, timeout=3)

    after = gw.cli("status")  # the child was killed and waited for: nothing answers
    assert after.returncode == 2 and "the daemon is not running" in after.stderr, after.stderr
