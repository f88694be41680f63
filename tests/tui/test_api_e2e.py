"""The dashboard against a real daemon (subprocess, two fake H100s): ApiBackend end to end."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
from textual.widgets import DataTable, Input, Log, Static

from gpuwarden.tui.api_backend import ApiBackend
from gpuwarden.tui.backend import SampleFrame
from gpuwarden.tui.screens.dialogs import KnobScreen
from gpuwarden.tui.screens.main import MainScreen
from gpuwarden.tui.widgets.gpu_card import GpuCard
from tests.daemon.conftest import (  # noqa: F401  (fixtures used by name)
    DaemonHandle,
    Freeze,
    command_spec,
    daemon_factory,
    freeze,
    gw,
    short_tmp,
)
from tests.daemon.test_logs_follow import retuned_spec
from tests.tui.conftest import SETTLE_S, make_app, messages, run, settle, until, wait_workers
from tests.tui.test_app import text_of

pytestmark = pytest.mark.slow

PRINTER = """
import time
for i in range(3000):
    print("line", i, flush=True)
    time.sleep(0.05)
"""


def test_api_backend_reads_a_live_daemon(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    backend = ApiBackend(gw.client())
    try:
        status = backend.status()
        assert status.source == "daemon" and status.sampling is None and status.controls
        gpus = backend.gpus()
        assert len(gpus) == 2 and "H100" in gpus[0].name
        snap = backend.snapshot()
        assert len(snap.gpus) == 2 and snap.host is not None and snap.processes is not None
        # The host's heaviest processes come with the GPU ones; this test's own process is one.
        assert snap.top is not None and snap.top.unavailable is None and snap.top.processes
        assert any(p.owned for p in snap.top.processes)
        stop = threading.Event()
        first = next(f for f in backend.frames(stop) if isinstance(f, SampleFrame))
        stop.set()
        assert len(first.snapshot.gpus) == 2
        gw.wait_samples(3)  # a few ticks into the store
        now = time.time()
        series = backend.history([gpus[0].uuid], ["util_gpu"], now - 300, now, 100)
        assert sum(p.value is not None for p in series[gpus[0].uuid]["util_gpu"]) >= 1
        host = backend.host_history(["cpu_percent", "mem_used", "mem_total"], now - 300, now, 100)
        assert set(host) == {"cpu_percent", "mem_used", "mem_total"} and len(host["mem_used"]) <= 100
        assert any(p.value for p in host["mem_total"])
    finally:
        backend.close()


def test_the_top_line_warns_while_the_daemon_cannot_write_its_database(
    gw: DaemonHandle,  # noqa: F811 (the fixture)
    freeze: Freeze,  # noqa: F811 (the fixture)
) -> None:
    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        app.health_poll_s = 0.1  # the test waits on the poll, not on a few seconds of it
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            status = app.query_one("#status", Static)
            assert "storage" not in text_of(status)
            freeze(gw.db, gw.db.with_name(gw.db.name + "-wal"))  # the sampler's next write is refused
            wanted = "storage: cannot write …/gpuwarden.db: marked immutable — clear the flag"
            await until(pilot, lambda: text_of(status).startswith(wanted), "the fault in the top line", 60)
            freeze.thaw()  # type: ignore[attr-defined]
            await until(pilot, lambda: "storage" not in text_of(status), "the warning gone", 60)
            assert "daemon" in text_of(status)  # the source is named again

    run(body())


def test_stop_a_real_run_from_the_dashboard(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    run_id = gw.submit(command_spec("printer", PRINTER))["id"]
    gw.wait_state(run_id, ("running",))

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            assert len(list(app.query(GpuCard))) == 2
            await pilot.press("2")
            await wait_workers(pilot)
            table = app.query_one("#runs-table", DataTable)
            assert str(table.get_row(run_id)[0]) == "running"
            assert str(table.get_row(run_id)[2]) in ("0", "1")  # the GPU the daemon placed it on
            await pilot.press("enter")
            await wait_workers(pilot)
            deadline = time.monotonic() + SETTLE_S
            log = app.screen.query_one("#log-view")
            while "line" not in "\n".join(getattr(log, "lines", [])):
                assert time.monotonic() < deadline, "the log tail never showed the run's output"
                await pilot.pause(0.1)
            await pilot.press("s", "y")
            await wait_workers(pilot)
            deadline = time.monotonic() + SETTLE_S
            while app.live.runs[run_id].state != "stopped":
                assert time.monotonic() < deadline, app.live.runs[run_id]
                await pilot.pause(0.1)

    run(body())
    assert gw.client().run(run_id).state == "stopped"


def test_a_run_submitted_from_the_dashboard_gets_the_dashboards_environment(
    gw: DaemonHandle,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The dashboard runs in the user's shell; the daemon was started without this variable.
    monkeypatch.setenv("GW_DASHBOARD_ONLY", "from-the-shell")
    assert "GW_DASHBOARD_ONLY" not in gw.env
    spec = gw.write_spec(
        "from-dashboard",
        f"""
        name: from-dashboard
        kind: command
        resources: {{gpus: 0}}
        command:
          argv: [{sys.executable}, -c, "import os; print('sees', os.environ.get('GW_DASHBOARD_ONLY'))"]
        """,
    )

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("n", *str(spec), "enter")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")

    run(body())
    with gw.client() as client:
        (submitted,) = client.runs()
    assert gw.wait_state(submitted.id)["state"] == "succeeded"
    with gw.client() as client:
        assert "sees from-the-shell" in client.logs(submitted.id, stream="stdout", attempt=1).data


def test_tune_a_stopped_script_from_the_dashboard_answers_as_the_daemon_does(
    gw: DaemonHandle,  # noqa: F811 (the fixture)
) -> None:
    # Whether a command run can be tuned depends on its roles, which the daemon checks: the
    # dashboard offers `t` and shows the daemon's answer, the fix included.
    run_id = gw.submit(command_spec("printer", PRINTER))["id"]
    gw.wait_state(run_id, ("running",))
    with gw.client() as client:
        client.stop(run_id, grace_seconds=0.5)
    gw.wait_state(run_id)

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() == run_id, "the stopped script selected")
            await pilot.press("t")
            await wait_workers(pilot)
            await until(
                pilot,
                lambda: any("name the knob that is the micro-batch" in m for m in messages(app)),
                "the daemon's answer in the dashboard",
            )

    run(body())
    assert gw.client().run(run_id).state == "stopped"  # refused: nothing changed


def _heading(lines: list[str], attempt: int) -> int:
    """Where the Log tab's line that opens `attempt` is."""
    return next(i for i, line in enumerate(lines) if line.startswith(f"── attempt {attempt}"))


def test_the_log_tab_shows_every_attempt_of_a_retuned_run(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    gate = gw.root / "gate"
    gate.touch()  # attempt 1 runs out of memory at once
    spec = retuned_spec(gw.root, gate)
    run_id = json.loads(gw.cli("run", str(spec), "--json").stdout)["id"]
    assert gw.wait_state(run_id)["state"] == "succeeded"

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await until(pilot, lambda: app.main.runs.selected_id() == run_id, "the run selected")
            await pilot.press("enter", "l")
            log = app.screen.query_one("#log-view", Log)
            await until(pilot, lambda: "the end of attempt 2" in "\n".join(log.lines), "attempt 2's output")
            lines = list(log.lines)
            first, second = (_heading(lines, n) for n in (1, 2))
            assert "micro-batch 32 → 16" in lines[second], lines[second]
            assert first < lines.index("output of attempt 1 at micro-batch 32") < second, lines
            assert second < lines.index("output of attempt 2 at micro-batch 16"), lines
            await pilot.press("o")  # every attempt's stderr too: attempt 1's allocator error
            await until(pilot, lambda: any("CUDA out of memory" in line for line in log.lines), "stderr")
            assert _heading(list(log.lines), 1) < _heading(list(log.lines), 2)

    run(body())


def test_run_a_finished_run_again_from_the_dashboard(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    spec = command_spec("knobbed", "print('done')", resources={"gpus": 0}, knobs={"n": 2, "lr": 0.1})
    old = gw.wait_state(gw.submit(spec)["id"])["id"]

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            app.main.runs.select(old)
            await until(pilot, lambda: app.main.runs.selected_id() == old, "the finished run selected")
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, KnobScreen), "the run-again dialog")
            field = app.screen.query_one(Input)
            await until(pilot, lambda: field.has_focus, "the knobs to edit")
            await pilot.press("ctrl+a", "ctrl+k", *"n=5", "enter")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "the dialog to close")
            await until(pilot, lambda: app.main.runs.selected_id() not in (None, old), "the new run selected")

    run(body())
    with gw.client() as client:
        new = [r for r in client.runs() if r.id != old]
        assert [r.name for r in new] == ["knobbed"]
        assert client.run(new[0].id).spec["knobs"] == {"n": 5, "lr": 0.1}
        assert client.run(old).spec["knobs"] == {"n": 2, "lr": 0.1}  # left as it was
