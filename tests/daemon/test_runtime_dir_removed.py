"""The runtime folder deleted under a running daemon (a /run or /tmp cleaner, a tidy user)."""

from __future__ import annotations

import shutil

from tests.daemon.conftest import DaemonHandle, command_spec, wait_for


def test_a_daemon_whose_socket_was_removed_stops_and_the_next_one_takes_over(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("long", "import time; time.sleep(600)"))
    gw.wait_state(run["id"], ("running",))
    assert gw.proc is not None
    shutil.rmtree(gw.runtime_dir)

    # Unreachable, it would hold the database forever: `up` refused, `down` "not running".
    wait_for(lambda: gw.proc is not None and gw.proc.poll() is not None, "the daemon to exit")
    assert gw.proc.returncode == 1  # not a stop anyone asked for: a service manager restarts it
    assert "API socket" in gw.log.read_text() and "was removed" in gw.log.read_text()

    up = gw.cli("up")
    assert up.returncode == 0, up.stderr
    gw.proc = None  # the daemon `up` started; `stop` brings it down with `gpuwarden down`
    attempts = gw.wait_state(run["id"], ("running",))["attempts"]
    assert [(a["attempt"], a["adopted"]) for a in attempts] == [(1, True)]  # re-adopted, not restarted
