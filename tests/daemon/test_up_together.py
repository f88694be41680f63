"""`gpuwarden up` typed in several shells at once, and a daemon started beside a running one:
only one daemon process ever exists."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import psutil

from tests.daemon.conftest import DaemonHandle

UPS = 5


def _daemons_of(gw: DaemonHandle) -> set[int]:
    """The pids of `gpuwarden daemon` processes of `gw`'s state folder now."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if "gpuwarden" not in argv or "daemon" not in argv:
            continue
        try:
            if proc.environ().get("XDG_STATE_HOME") == gw.env["XDG_STATE_HOME"]:
                found.add(proc.pid)
        except psutil.Error:
            pass  # it has exited since it was listed
    return found


def test_five_ups_at_once_start_one_daemon_process(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory(start=False)
    gate = threading.Barrier(UPS)
    results: list[subprocess.CompletedProcess[str]] = []

    def up() -> None:
        gate.wait()
        results.append(gw.cli("up", "--json", timeout=120))

    threads = [threading.Thread(target=up) for _ in range(UPS)]
    for thread in threads:
        thread.start()
    seen: set[int] = set()
    while any(thread.is_alive() for thread in threads):
        seen |= _daemons_of(gw)
    for thread in threads:
        thread.join()
    seen |= _daemons_of(gw)
    assert [r.returncode for r in results] == [0] * UPS, [r.stderr for r in results]
    answers = [json.loads(r.stdout) for r in results]
    (pid,) = {a["pid"] for a in answers}
    assert seen == {pid}, f"daemon processes seen: {sorted(seen)}"
    assert sorted(a["started"] for a in answers) == [False] * (UPS - 1) + [True]
    assert gw.cli_json("status")["daemon"]["pid"] == pid


def test_a_second_daemon_is_refused_before_it_loads_the_server(gw: DaemonHandle) -> None:
    """It takes the lock first: daemons started together overlap for as little as they can."""
    assert gw.proc is not None
    second = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuwarden", "daemon"],
        env=gw.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    refusal = second.stderr.splitlines()[-1]
    assert refusal == f"gpuwarden: gpuwarden daemon already running (pid {gw.proc.pid})"
    imported = {line.rsplit("|", 1)[-1].strip() for line in second.stderr.splitlines() if "|" in line}
    server = {"uvicorn", "fastapi", "psutil"}
    assert server.isdisjoint(imported), sorted(imported & server)
