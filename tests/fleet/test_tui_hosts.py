"""The dashboard over two hosts reached through a real sshd: every GPU in the hosts tab, the runs
of both with their host, a run's screen from its own host, a host that stops and comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from textual.widgets import DataTable, Static

from gpuwarden.client.hosts import Fleet
from gpuwarden.client.ssh_forward import SshCommand
from gpuwarden.tui.app import GpuwardenApp
from gpuwarden.tui.fleet_backend import FleetBackend, only_here
from gpuwarden.tui.screens.dialogs import KnobScreen, SubmitScreen
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


def test_n_submits_a_spec_here_to_the_host_chosen(world: World, tmp_path: Path) -> None:
    """With several hosts, `n` asks which one (ctrl+t goes to the next); the run starts there."""
    spec = tmp_path / "hello.yaml"
    spec.write_text(yaml.safe_dump(command_spec("hello-h2", "print('hi')", resources={"gpus": 0})))
    app = GpuwardenApp(_backend(world), cwd=tmp_path)

    async def body() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one("#hosts-table", DataTable)
            await until(pilot, lambda: _hosts_of(table) == ["h1", "h1", "h2"], "both hosts")
            await pilot.press("n")
            await until(pilot, lambda: isinstance(app.screen, SubmitScreen), "the submit dialog")
            dialog = app.screen
            assert isinstance(dialog, SubmitScreen) and dialog.host == "h1"
            await pilot.press("ctrl+t")
            assert dialog.host == "h2" and "on host h2" in str(
                dialog.query_one("#submit-host", Static).render()
            )
            await pilot.press(*"hello.yaml", "enter")
            await until(pilot, lambda: not isinstance(app.screen, SubmitScreen), "the run submitted")
            runs = app.main.runs
            await until(pilot, lambda: any(r.name == "hello-h2" for r in runs._all), "the run listed")
            (row,) = [r for r in runs._all if r.name == "hello-h2"]
            assert row.host == "h2"

    run(body())
    with world.hosts["h2"].client() as client:
        assert [r.name for r in client.runs()] == ["hello-h2"]
    with world.hosts["h1"].client() as client:
        assert not client.runs()


def test_run_again_goes_to_the_host_of_the_run(world: World) -> None:
    """`R` on a finished run of h2: the new run, from its spec, is submitted to h2."""
    handle = world.hosts["h2"]
    done = handle.submit(command_spec("again-h2", "print('x')", resources={"gpus": 0}))
    old = handle.wait_state(done["id"])["id"]
    app = GpuwardenApp(_backend(world), cwd=Path.cwd())

    async def body() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            runs = app.main.runs
            await until(pilot, lambda: any(r.id == old for r in runs._all), "the run listed")
            await pilot.press("2")
            runs.select(old)
            await until(pilot, lambda: runs.selected_id() == old, "the run selected")
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, KnobScreen), "the new run submitted")

            def again() -> list[str | None]:
                return [r.host for r in runs._all if r.name == "again-h2"]

            await until(pilot, lambda: len(again()) == 2, "the new run listed")
            assert again() == ["h2", "h2"]
            assert runs.selected_id() not in (None, old)

    run(body())
    with world.hosts["h2"].client() as client:
        assert [r.name for r in client.runs()] == ["again-h2", "again-h2"]
    with world.hosts["h1"].client() as client:
        assert not client.runs()


def test_a_path_the_host_lacks_but_this_machine_has_is_said(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    refusal = f"model directory {model} does not exist — build it first"
    said = only_here(refusal, "gpu2")
    assert said.startswith(refusal) and f"{model} exists on this machine, not on gpu2" in said
    assert only_here("model directory /nowhere/at/all does not exist", "gpu2").endswith("does not exist")
