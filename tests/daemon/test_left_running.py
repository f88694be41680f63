"""What an attempt starts outside its process group (`setsid`, a daemonized helper) ends with it,
and the run says so: real processes, a real daemon."""

from __future__ import annotations

import psutil

from tests.daemon.conftest import DaemonHandle, wait_for

# A helper in a session of its own (its pid written down), one in the program's own group, then
# the program ends.
PROGRAM = "setsid sleep 300 & echo $! > escaped.pid; sleep 200 & echo started; exit 0"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_helper_started_in_a_session_of_its_own_is_killed_and_named(gw: DaemonHandle) -> None:
    here = gw.root / "helper"
    here.mkdir()
    result = gw.cli("run", "--name", "helper", "--gpus", "0", "--follow", "--", "sh", "-c", PROGRAM, cwd=here)
    assert result.returncode == 0, result.stderr
    escaped = int((here / "escaped.pid").read_text())
    wait_for(lambda: _gone(escaped), f"pid {escaped} (setsid sleep 300) to end with its run")
    shown = gw.cli("show", "helper").stdout
    assert (
        f"warning:  attempt 1 left 1 process(es) running outside its process group (pid {escaped} sleep)"
        in (shown)
    ), shown
    assert gw.cli_json("show", "helper")["state"] == "succeeded"  # what it left does not fail it
    events = gw.cli_json("events", "helper")
    warned = [e for e in events["events"] if e["type"] == "warning" and e.get("code") == "left_running"]
    assert len(warned) == 1 and warned[0]["attempt"] == 1
