"""`gpuwarden down` returns once the daemon's process has exited, long requests in flight do not
hold it up, and the instance lock goes only with the process."""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from typing import Any

import psutil

from gpuwarden.core.errors import UserError
from tests import preloaded
from tests.daemon.conftest import FINAL, DaemonHandle, command_spec

LONG_POLL_S = 30.0


def test_down_returns_when_the_process_has_exited(gw: DaemonHandle) -> None:
    assert gw.proc is not None
    result = gw.cli("down")
    assert result.returncode == 0, result.stderr
    assert "has exited" in result.stdout and result.stdout.count("\n") == 1
    # Nothing to wait for: the process is already gone when `down` returns.
    assert gw.proc.poll() == 0
    again = gw.cli("down")
    assert again.returncode == 0 and again.stdout.strip() == "gpuwarden daemon is not running"


def test_long_requests_in_flight_do_not_hold_the_daemon(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("sleeper", "import time; time.sleep(120)", resources={"gpus": 0}))
    gw.wait_state(run["id"], ("running",))
    answered: list[str] = []

    def long_poll(kind: str) -> None:
        with contextlib.suppress(UserError), gw.client(timeout=LONG_POLL_S + 10) as client:
            if kind == "events":
                client.events(run["id"], since=10**9, wait=LONG_POLL_S)
            else:
                client.logs(run["id"], offset=10**6, wait=LONG_POLL_S)
            answered.append(kind)  # an answer, not a connection cut by the shutdown

    threads = [threading.Thread(target=long_poll, args=(k,), daemon=True) for k in ("events", "logs")]
    for t in threads:
        t.start()
    _wait_for(lambda: _in_flight(gw) >= 2)
    start = time.monotonic()
    result = gw.cli("down", timeout=60)
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert gw.proc is not None and gw.proc.poll() == 0
    # The long-polls ended early with an answer, far before their 30 s (a generous bound).
    assert took < 10.0, took
    for t in threads:
        t.join(timeout=10)
    assert sorted(answered) == ["events", "logs"]


def test_a_second_daemon_cannot_start_while_the_first_runs(gw: DaemonHandle) -> None:
    second = preloaded.run([sys.executable, "-m", "gpuwarden", "daemon"], env=gw.env, timeout=60)
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        f"gpuwarden daemon already running (pid {gw.proc.pid if gw.proc else '?'})"
    )
    with gw.client() as client:
        assert client.health().pid == (gw.proc.pid if gw.proc else None)


def _in_flight(gw: DaemonHandle) -> int:
    """Connections the daemon has accepted on its socket (its Unix sockets less the listener)."""
    assert gw.proc is not None
    return sum(1 for c in psutil.Process(gw.proc.pid).net_connections(kind="unix") if c.status == "NONE") - 1


def _wait_for(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_after_down_the_database_file_alone_holds_everything(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("kept", "print('done')", resources={"gpus": 0}))
    gw.wait_state(run["id"], FINAL)
    down = gw.cli("down")
    assert down.returncode == 0, down.stderr
    gw.proc = None
    copy = gw.root / "copied" / "gpuwarden.db"
    copy.parent.mkdir()
    shutil.copy(gw.db, copy)  # `cp gpuwarden.db`, as a user copies a file to look at elsewhere
    result = gw.cli("report", run["id"], "--db", str(copy))
    assert result.returncode == 0, result.stderr
    assert "kept" in result.stdout
