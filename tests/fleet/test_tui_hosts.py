"""The dashboard over two hosts reached through a real sshd: every GPU in the hosts tab, the runs
of both with their host, a run's screen from its own host, a host that stops and comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from gpuwarden.client.hosts import Fleet
from gpuwarden.client.ssh_forward import SshCommand
from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.fleet_backend import FleetBackend
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from tests.daemon.conftest import command_spec
from tests.fleet.conftest import World, ssh_processes
from tests.tui.conftest import run, until

pytestmark = pytest.mark.slow


def _backend(world: World) -> FleetBackend:
    remote = world.sshd.client_env()["GPUWARDEN_SSH__GPUWARDEN"]
    ssh = SshCommand(("ssh", "-F", str(world.sshd.ssh_config)), 5.0, 10.0, remote)
    return FleetBackend(Fleet(["h1", "h2"], ssh, world.client_root / "run"))


def _hosts_of(table: DataTable[object]) -> list[str]:
    return sorted(str(table.get_row_at(i)[0]) for i in range(table.row_count))


def _down_text(app: GpuwardenApp) -> str:
    return str(app.query_one("#hosts-down", Static).render())


def test_the_dashboard_shows_both_hosts_and_a_host_that_stops(world: World) -> None:
    finished = {}
    for host in ("h1", "h2"):
        handle = world.hosts[host]
        done = handle.submit(command_spec(f"on-{host}", "print('x')", resources={"gpus": 0}))
        finished[host] = handle.wait_state(done["id"])["id"]
    app = GpuwardenApp(_backend(world), cwd=Path.cwd())

    async def body() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one("#hosts-table", DataTable)
            await until(pilot, lambda: _hosts_of(table) == ["h1", "h1", "h2"], "three GPUs of two hosts")
            runs = app.main.runs
            await until(pilot, lambda: len(runs._all) == 2, "the runs of both hosts")
            assert {(r.id, r.host) for r in runs._all} == {(finished["h1"], "h1"), (finished["h2"], "h2")}
            assert [c[0] for c in runs.columns][:2] == ["state", "host"]

            app.open_run(finished["h2"])
            await until(
                pilot,
                lambda: isinstance(app.screen, RunDetailScreen) and app.screen.detail is not None,
                "the run's screen, read from h2",
            )
            assert isinstance(app.screen, RunDetailScreen) and app.screen.detail is not None
            assert app.screen.detail.run.host == "h2"
            app.pop_screen()

            world.hosts["h2"].stop()
            await until(pilot, lambda: "host h2: no gpuwarden daemon" in _down_text(app), "h2's one line")
            assert _hosts_of(table) == ["h1", "h1"]
            world.hosts["h2"].start()
            await until(pilot, lambda: _hosts_of(table) == ["h1", "h1", "h2"], "h2 back", timeout=90)
            assert _down_text(app).strip() == ""

    run(body())
    assert not ssh_processes(world.sshd), "the dashboard left ssh processes behind"
