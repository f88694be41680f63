"""`gpuwarden tui --runs DIR`: the dashboard over the run folders `gpuwarden exec` keeps, read-only.

The folders are made for real: `python -m gpuwarden exec` supervises a one-line command in private
XDG folders with two fake H100s (under a second each), as a cluster job would.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Log, Static

from gpuwarden.cli.main import main
from gpuwarden.core.errors import UserError
from gpuwarden.slurm.record import WAITING, SlurmRecord
from gpuwarden.tui.backend import RunRow
from gpuwarden.tui.db_backend import DbBackend
from gpuwarden.tui.runs_backend import RunsBackend
from gpuwarden.tui.screens.run_detail import RunDetailScreen
from tests.daemon.conftest import wait_for
from tests.tui.conftest import make_app, run, settle, until
from tests.tui.test_app import footer_keys, text_of, timeline_text

REPO = Path(__file__).resolve().parents[2]
CONTROLS = {"stop_run", "resume_run", "edit_run", "tune_run", "submit"}


class Folders:
    """A runs folder that `gpuwarden exec` fills, one run per call."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "gpuwarden-runs"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))},
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_RUNTIME_DIR": str(root / "runtime"),
            "GPUWARDEN_FAKE_NVML": "h100x2",
            "GPUWARDEN_SAMPLE_INTERVAL": "0.25",
            "PYTHONPATH": str(REPO),
        }
        self.ids: dict[str, str] = {}  # run name → id

    def start(self, name: str) -> subprocess.Popen[str]:
        """`gpuwarden exec` of a command that prints a line naming the run."""
        argv = ["exec", "--runs", str(self.dir), "--gpus", "1", "--name", name, "--"]
        code = f"print('hello from {name}')"
        return subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", *argv, sys.executable, "-c", code],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self, name: str, proc: subprocess.Popen[str]) -> str:
        """Wait for the exec; the run's id (its folder's name)."""
        before = set(self.ids.values())
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        (new,) = {p.name for p in self.dir.iterdir()} - before
        self.ids[name] = new
        return new

    def add(self, name: str) -> str:
        return self.finish(name, self.start(name))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Folders:
    """Two finished runs, `first` then `second` (read only by the tests that use it)."""
    made = Folders(tmp_path_factory.mktemp("runs"))
    made.add("first")
    made.add("second")
    return made


def test_the_dashboard_shows_every_run_folder_read_only_and_new_ones_as_they_come(tmp_path: Path) -> None:
    made = Folders(tmp_path)
    first = made.add("first")
    second = made.add("second")

    async def body() -> None:
        backend = RunsBackend(made.dir)
        backend.poll_s = 0.05
        app = make_app(backend, clock=time.time)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.readonly and "read-only" in text_of(app.query_one("#status", Static))
            await pilot.press("2")
            table = app.query_one("#runs-table", DataTable)
            await until(pilot, lambda: table.row_count == 2, "both runs")
            rows = [table.get_row_at(i) for i in range(2)]
            assert [(str(r[0]), str(r[1]), r[-1]) for r in rows] == [
                ("succeeded", "second", second),  # newest first
                ("succeeded", "first", first),
            ]
            assert not footer_keys(app) & CONTROLS
            app.main.runs.select(first)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunDetailScreen), "the run's screen")
            screen = app.screen
            assert isinstance(screen, RunDetailScreen)
            await until(pilot, lambda: screen.detail is not None, "the run's detail")
            assert screen.detail is not None and [a.attempt for a in screen.detail.attempts] == [1]
            assert "succeeded: attempt 1: exit code 0" in timeline_text(screen)
            assert not footer_keys(app) & CONTROLS
            await pilot.press("l")
            log = screen.query_one("#log-view", Log)
            await until(pilot, lambda: "hello from first" in "\n".join(log.lines), "the run's log")
            await pilot.press("escape")
            # A job starts on the cluster while the dashboard is open.
            proc = made.start("third")
            try:
                await until(pilot, lambda: "third" in _names(table), "the new run", timeout=30)
            finally:
                third = made.finish("third", proc)
            await until(pilot, lambda: str(table.get_row(third)[0]) == "succeeded", "the new run's end")
            assert table.get_row_at(0)[-1] == third

    run(body())


def _names(table: DataTable[object]) -> list[str]:
    return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]


def test_the_runs_read_as_one_source_and_nothing_is_written(folders: Folders) -> None:
    stores = sorted(folders.dir.glob("*/run.db"))
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in stores]
    backend = RunsBackend(folders.dir)
    status = backend.status()
    assert (status.source, status.location, status.controls) == ("runs", str(folders.dir), False)
    assert [r.name for r in backend.runs()] == ["second", "first"]
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1]  # one machine: both stores name the same two GPUs
    now = time.time()
    merged = backend.history([g.uuid for g in gpus], ["mem_used"], now - 300, now + 1, 600)
    for path in stores:  # every reading of each store is in the merged series
        one = DbBackend(path)
        one.gpus()
        alone = one.history([g.uuid for g in gpus], ["mem_used"], now - 300, now + 1, 600)
        one.close()
        for uuid, series in alone.items():
            read = {p.ts for p in series["mem_used"] if p.value is not None}
            assert read and read <= {p.ts for p in merged[uuid]["mem_used"] if p.value is not None}
    newest = folders.ids["second"]
    detail = backend.run_detail(newest)
    assert detail.run.name == "second" and len(detail.attempts) == 1
    assert backend.logs(newest, 0).data == "hello from second\n"
    with pytest.raises(Exception, match="read-only"):
        backend.stop_run(newest)
    backend.close()
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in stores] == digests


def test_a_run_whose_slurm_job_has_not_started_is_queued(tmp_path: Path) -> None:
    folder = tmp_path / "gpuwarden-runs" / "r0123456789"
    folder.mkdir(parents=True)
    SlurmRecord(4242, "r0123456789", "llm", "train", time.time(), 10).write(folder)
    backend = RunsBackend(folder.parent)
    (row,) = backend.runs()
    assert (row.id, row.state, row.message, row.attempt) == ("r0123456789", "queued", WAITING, 0)
    assert backend.run_detail(row.id).attempts == []
    assert backend.logs(row.id, 0).data == ""
    with pytest.raises(Exception, match="has not started"):
        backend.doctor(row.id)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--runs", "{tmp}/missing"], "--runs {tmp}/missing: no such folder"),
        (["--runs", "{tmp}"], "--runs {tmp}: no run folder in it"),
        (
            ["--runs", "{one}"],
            "--runs {one} is one run's folder — give the folder that holds it: --runs {dir}",
        ),
        (["--runs", "{dir}", "--db", "{one}/run.db"], "--db and --runs: give one"),
    ],
)
def test_bad_folders_are_one_line(
    folders: Folders, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    where = {"tmp": tmp_path, "dir": folders.dir, "one": folders.dir / folders.ids["first"]}
    with pytest.raises(SystemExit) as exited:
        main(["tui", *(a.format(**where) for a in args)])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuwarden: {said.format(**where)}")


def test_a_run_whose_exec_died_with_its_job_reads_as_interrupted(tmp_path: Path) -> None:
    """The record of a run killed with its job still says running; no exec holds its folder, so
    the dashboard (as `ps --runs`) says it was interrupted and how to take it up."""
    made = Folders(tmp_path)
    go = tmp_path / "go"
    waits = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    argv = [
        "exec",
        "--runs",
        str(made.dir),
        "--gpus",
        "1",
        "--name",
        "killed",
        "--",
        sys.executable,
        "-c",
        waits,
    ]
    proc = subprocess.Popen([sys.executable, "-m", "gpuwarden", *argv], env=made.env, start_new_session=True)
    try:
        backend_rows = wait_for(lambda: _running_rows(made.dir), "the run to be recorded running")
        assert [r.name for r in backend_rows] == ["killed"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the exec, and below the program (its own session): a job's end
        proc.wait(30)
        for store in made.dir.rglob("run.db"):
            _kill_recorded(store)
    backend = RunsBackend(made.dir)
    try:
        (row,) = backend.runs()
        assert row.state == "interrupted"
        assert row.message is not None and row.message.startswith("its gpuwarden exec is gone (was running)")
    finally:
        backend.close()


def _running_rows(folder: Path) -> list[RunRow]:
    if not folder.exists():
        return []
    try:
        backend = RunsBackend(folder)
    except UserError:  # no run recorded yet
        return []
    try:
        return [r for r in backend.runs() if r.state == "running"]
    finally:
        backend.close()


def _kill_recorded(store: Path) -> None:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        for (pid,) in conn.execute("SELECT pid FROM attempts WHERE pid IS NOT NULL"):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
