"""The suite's forked `gpuwarden` commands behave as `python -m gpuwarden` started afresh: the same
output, exit status, folder and environment, signals and timeouts (`tests/preloaded.py`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import preloaded

GPUWARDEN = [sys.executable, "-m", "gpuwarden"]


@pytest.fixture(autouse=True)
def _forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the forked path, whatever the suite was asked to do."""
    monkeypatch.delenv("GPUWARDEN_TESTS_PRELOAD", raising=False)


def _daemon_env(root: Path, runtime: Path) -> dict[str, str]:
    """A daemon's private folders (a short runtime folder: a socket's path has 107 bytes)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))},
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_STATE_HOME": str(root / "state"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "GPUWARDEN_FAKE_NVML": "h100x2",
    }


def _fresh(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUWARDEN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


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
    fresh = _fresh(args, env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr


def test_the_child_has_its_own_pid_streams_and_signals(tmp_path: Path) -> None:
    """A daemon forked in its own folder and environment, stopped by SIGTERM (exit 0 as a
    fresh one's) and another killed (-9, as `subprocess` says it)."""
    runtime = Path(tempfile.mkdtemp(prefix="gwp", dir="/tmp"))
    env = _daemon_env(tmp_path, runtime)
    try:
        for sig, code in ((signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)):
            with (tmp_path / "daemon.log").open("ab") as log:
                daemon = preloaded.popen(
                    [*GPUWARDEN, "daemon"], env=env, cwd=tmp_path, stdout=log, stderr=log
                )
            assert daemon.pid != os.getpid() and daemon.poll() is None
            assert _answering_pid(env, tmp_path, daemon) == daemon.pid
            assert (runtime / "gpuwarden" / "api.sock").is_socket()  # where its environment says
            daemon.send_signal(sig)
            assert daemon.wait(timeout=30) == code
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert "gpuwarden daemon" in (tmp_path / "daemon.log").read_text()


def _answering_pid(env: dict[str, str], cwd: Path, daemon: preloaded.Process) -> int:
    """The pid `gpuwarden status` names once the daemon answers."""
    pause = 0.02
    while daemon.poll() is None:
        status = preloaded.run([*GPUWARDEN, "status", "--json"], env=env, cwd=cwd, timeout=60)
        if status.returncode == 0:
            pid: int = json.loads(status.stdout)["daemon"]["pid"]
            return pid
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    raise AssertionError(f"the daemon exited {daemon.returncode} before it answered")


def test_a_timeout_raises_and_kills_the_child(tmp_path: Path) -> None:
    env = _daemon_env(tmp_path, Path(tempfile.mkdtemp(prefix="gwp", dir="/tmp")))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            preloaded.run([*GPUWARDEN, "daemon"], env=env, cwd=tmp_path, timeout=3)
        after = preloaded.run([*GPUWARDEN, "status"], env=env, cwd=tmp_path, timeout=60)
        assert after.returncode == 2 and "the daemon is not running" in after.stderr, after.stderr
    finally:
        shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)
