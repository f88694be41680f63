"""A user's script that reports nothing but draws a tqdm bar: its progress reaches `show`, `events`
and the dashboard's runs table through a real daemon; `run --follow` does not print it twice."""

from __future__ import annotations

import sys
import time

import pytest
from textual.widgets import DataTable, Static
from textual.widgets.data_table import RowDoesNotExist

from gpuwarden.tui.api_backend import ApiBackend
from tests.daemon.conftest import (  # noqa: F401  (fixtures used by name)
    DaemonHandle,
    daemon_factory,
    gw,
    short_tmp,
    wait_for,
)
from tests.tui.conftest import make_app, run, settle, until
from tests.tui.test_app import text_of

pytestmark = pytest.mark.slow

# Five of twenty steps, then it waits to be told to finish. Its steps take a fifth of a second, as
# a program's steps take time (tqdm has a rate to write); nothing in the test waits on them.
SCRIPT = """
import pathlib, time
from tqdm import tqdm
bar = tqdm(total=20, desc="train", mininterval=0)
for _ in range(5):
    time.sleep(0.2)
    bar.update(1)
while not pathlib.Path("go").exists():
    time.sleep(0.05)
bar.update(15)
bar.close()
"""


def _progress_line(daemon: DaemonHandle, name: str) -> str | None:
    shown = daemon.cli("show", name).stdout
    return next((line for line in shown.splitlines() if line.startswith("progress:")), None)


def _said_at(daemon: DaemonHandle, count: str) -> list[str]:
    line = _progress_line(daemon, "bar")
    return [line] if line is not None and count in line else []


def test_a_scripts_own_bar_is_its_progress(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    here = gw.root / "bar"
    here.mkdir()
    (here / "train.py").write_text(SCRIPT)
    submitted = gw.cli("run", "--name", "bar", "--gpus", "0", "--", sys.executable, "train.py", cwd=here)
    assert submitted.returncode == 0, submitted.stderr
    line = wait_for(lambda: _said_at(gw, "5/20"), "show to say 5/20")[0]
    assert line.startswith("progress: train: 5/20 it (25 %), "), line
    assert " it/s, " in line and " left (its progress bar at " in line, line
    events = gw.cli("events", "bar").stdout
    assert "progress_bar: train: 5/20 it (25 %)" in events, events

    async def body() -> None:
        app = make_app(ApiBackend(gw.client()), clock=time.time)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            table = app.query_one("#runs-table", DataTable)
            run_id = gw.cli_json("show", "bar")["id"]

            def progress_cell() -> str:
                try:
                    return str(table.get_row(run_id)[3])
                except RowDoesNotExist:  # the row is not there yet
                    return ""

            await until(pilot, lambda: progress_cell().endswith(" 25%"), "the row's progress at 25 %")
            eta = str(table.get_row(run_id)[4])
            assert eta.endswith("s"), eta  # tqdm's count and rate: fifteen steps at about five a second
            table.move_cursor(row=table.get_row_index(run_id))
            await pilot.press("enter")
            await until(
                pilot,
                lambda: " 25 %, " in text_of(app.screen.query_one("#run-head", Static)),
                "the run's head",
            )

    run(body())
    (here / "go").touch()
    assert gw.wait_state(gw.cli_json("show", "bar")["id"])["state"] == "succeeded"
    assert _progress_line(gw, "bar") is None  # a finished run's bar is history, not its progress


def test_follow_prints_the_bar_once(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    here = gw.root / "follow"
    here.mkdir()
    (here / "train.py").write_text(SCRIPT.replace('pathlib.Path("go").exists()', "True"))
    result = gw.cli(
        "run", "--name", "follow", "--gpus", "0", "--follow", "--", sys.executable, "train.py", cwd=here
    )
    assert result.returncode == 0, result.stderr
    assert "20/20" in result.stderr  # the program's own bar, as it drew it
    assert "progress_bar" not in result.stderr + result.stdout
    # Recorded all the same: the bar as the program left it, read once it exited.
    assert "progress_bar: train: 20/20 it (100 %)" in gw.cli("events", "follow").stdout


# Reports its progress through the SDK before it draws anything, and draws a bar as well. However
# fast it runs, the daemon reads its logs once more as it exits: the bar would be recorded then.
REPORTING = """
from tqdm import tqdm
from gpuwarden import sdk
sdk.progress(0, 0, total=160)
for step in tqdm(range(1, 21), desc="train", mininterval=0):
    sdk.progress(step, 8 * step, total=160)
"""


def test_a_run_that_reports_its_progress_is_not_read_from_its_bar(gw: DaemonHandle) -> None:  # noqa: F811 (the fixture)
    here = gw.root / "reporting"
    here.mkdir()
    (here / "train.py").write_text(REPORTING)
    result = gw.cli(
        "run", "--name", "reporting", "--gpus", "0", "--follow", "--", sys.executable, "train.py", cwd=here
    )
    assert result.returncode == 0, result.stderr
    types = [e["type"] for e in gw.cli_json("events", "reporting")["events"]]
    assert types.count("progress") == 21 and "progress_bar" not in types, types
