"""The host's heaviest processes through a real daemon's API, as the dashboard reads them."""

from __future__ import annotations

import os

import httpx

from gpuwarden.core.api import HostProcesses
from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

# Busy for as long as the test needs it (the test stops the run).
SPIN = "while True: pass"


def test_a_busy_run_is_listed_with_its_run_and_a_measured_cpu_share(gw: DaemonHandle) -> None:
    run = gw.submit(command_spec("spinner", SPIN, resources={"gpus": 0}))
    try:
        attempt = gw.wait_state(run["id"], ("running",))
        with gw.client() as client:

            def spinning() -> HostProcesses | None:
                answer = client.host_processes(top=5)
                mine = [p for p in answer.processes if p.run_id == run["id"]]
                busy = [p for p in mine if p.cpu_percent is not None and p.cpu_percent > 20]
                return answer if busy else None

            answer = wait_for(spinning, "the spinning run among the busiest processes")
        assert answer is not None
        assert attempt["state"] == "running"
        assert answer.cpu_count is not None and answer.cpu_count >= 1
        assert len(answer.processes) <= 10  # five by CPU, five by memory, some both
        cpus = [p.cpu_percent for p in answer.processes if p.cpu_percent is not None]
        assert cpus == sorted(cpus, reverse=True)  # busiest first
        spinner = next(p for p in answer.processes if p.run_id == run["id"])
        assert spinner.user and spinner.rss and spinner.cmdline and SPIN in spinner.cmdline
        daemon = [p for p in answer.processes if p.pid == os.getpid()]
        assert all(p.run_id is None for p in daemon)  # a process no run started names none
    finally:
        with gw.client() as client:
            client.stop(run["id"])
        gw.wait_state(run["id"])


def test_a_count_out_of_range_is_one_line_naming_it(gw: DaemonHandle) -> None:
    transport = httpx.HTTPTransport(uds=str(gw.socket))
    with httpx.Client(transport=transport, base_url="http://gw") as http:
        for bad in ("0", "101", "many"):
            answer = http.get("/v1/host/processes", params={"top": bad})
            assert answer.status_code == 422
            body = answer.json()
            assert body["error"]["code"] == "invalid_request"
            assert "top" in body["error"]["message"] and "\n" not in body["error"]["message"]
