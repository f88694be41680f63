"""The real process layer: run tags found in /proc, whole groups killed, adoption by create time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.core.exit_record import STATUS_FILE
from gpuwarden.daemon.process import RUN_TAG, ExitStatus, LocalProcesses, or_recorded, run_tag, spawn
from tests.daemon.conftest import wait_for

# Starts a child in its own process group, prints both pids, then waits.
PARENT = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(kid.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def tagged_family(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    run_id = "r" + os.urandom(5).hex()
    env = {**os.environ, RUN_TAG: run_tag(run_id, 1)}
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    kid = int(proc.stdout.readline())
    try:
        yield proc, kid, run_id
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_tagged_processes_are_found_with_their_attempt_and_group(
    tagged_family: tuple[subprocess.Popen[str], int, str],
) -> None:
    proc, kid, run_id = tagged_family

    def both() -> dict[int, Any]:
        # The kid's pid is printed before its exec ends; mid-exec its environment cannot be read.
        found = {t.pid: t for t in LocalProcesses().tagged() if t.run_id == run_id}
        return found if set(found) == {proc.pid, kid} else {}

    mine = wait_for(both, "the parent and its child, both tagged", timeout=30)
    assert mine[proc.pid].leader and not mine[kid].leader
    assert {t.attempt for t in mine.values()} == {1}
    assert {t.group for t in mine.values()} == {proc.pid}
    child = LocalProcesses().adopt(proc.pid, mine[proc.pid].create_time)
    assert child.poll() is None and child.adopted


def test_kill_takes_the_whole_group_and_waits_for_it(
    tagged_family: tuple[subprocess.Popen[str], int, str],
) -> None:
    proc, kid, run_id = tagged_family
    layer = LocalProcesses()
    started = time.monotonic()
    layer.kill([t for t in layer.tagged() if t.run_id == run_id and t.leader])
    assert time.monotonic() - started < 5
    # psutil reaped it (this test is its parent; the daemon never is): it is simply gone.
    assert not psutil.pid_exists(proc.pid)
    wait_for(lambda: not any(t.pid == kid for t in layer.tagged()), "the child to be gone")


# Stands for torchrun: starts two ranks (RANK in their environment, its own group), prints their
# pids, then waits until it is signalled.
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "ranks = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
    " env={**os.environ, 'RANK': str(r)}) for r in (0, 1)]\n"
    "print(*(p.pid for p in ranks), flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def recorded_launcher(tmp_path: Path) -> Iterator[tuple[Any, str, Path]]:
    """A command run's attempt as the daemon spawns it: through the exit-status recorder."""
    run_id = "r" + os.urandom(5).hex()
    env = {**os.environ, RUN_TAG: run_tag(run_id, 1)}
    child = LocalProcesses().spawn(
        [sys.executable, "-c", LAUNCHER],
        env,
        tmp_path,
        tmp_path / "stdout.log",
        tmp_path / "stderr.log",
        exit_file=tmp_path / STATUS_FILE,
    )
    try:
        yield child, run_id, tmp_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        assert child.popen is not None
        child.popen.wait()


def test_a_recorded_attempt_is_found_led_by_its_recorder_and_ends_as_its_program_did(
    recorded_launcher: tuple[Any, str, Path],
) -> None:
    child, run_id, folder = recorded_launcher
    stdout = folder / "stdout.log"
    ranks = [int(p) for p in wait_for(lambda: stdout.read_text().split(), "the launcher's ranks")]
    layer = LocalProcesses()
    assert layer.ranks(child.pid) == {0: ranks[0], 1: ranks[1]}  # torchrun's ranks, seen through the recorder

    def family() -> list[Any]:
        found = [t for t in layer.tagged() if t.run_id == run_id]
        return found if len(found) == 4 else []

    found = wait_for(family, "the recorder, the launcher and its ranks, all tagged", timeout=30)
    assert [t.pid for t in found if t.leader] == [child.pid]  # what a restarted daemon adopts
    assert {t.group for t in found} == {child.pid}
    assert child.signal_group(signal.SIGTERM)
    status = wait_for(child.poll, "the attempt to end")
    assert (status.code, status.signal) == (None, signal.SIGTERM)  # the program's, as before the recorder
    assert or_recorded(ExitStatus(None, None), folder / STATUS_FILE) == status


def test_a_program_that_cannot_start_is_refused_before_the_recorder_starts(tmp_path: Path) -> None:
    for program, error in (("/nonexistent/x", FileNotFoundError), ("no-such-program-xyz", FileNotFoundError)):
        with pytest.raises(error):
            spawn(
                [program],
                dict(os.environ),
                tmp_path,
                tmp_path / "o",
                tmp_path / "e",
                exit_file=tmp_path / "x",
            )
    (tmp_path / "script.sh").write_text("echo hi\n")  # not executable
    with pytest.raises(PermissionError):
        spawn(
            ["./script.sh"],
            dict(os.environ),
            tmp_path,
            tmp_path / "o",
            tmp_path / "e",
            exit_file=tmp_path / "x",
        )


def test_a_program_found_through_a_relative_path_entry_is_looked_up_in_the_runs_folder(
    tmp_path: Path,
) -> None:
    """A PATH entry such as `bin` names the run's `bin`, not one under the daemon's cwd."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "my-tool"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"bin{os.pathsep}{os.environ['PATH']}"}
    child = spawn(
        ["my-tool"], env, tmp_path, tmp_path / "o", tmp_path / "e", exit_file=tmp_path / STATUS_FILE
    )
    status = wait_for(child.poll, "the program to end")
    assert status is not None
    assert (status.code, status.signal) == (0, None), (tmp_path / "e").read_text()


def test_the_wrappers_ignore_the_runs_python_path(tmp_path: Path) -> None:
    """A user's `resource.py` on PYTHONPATH is the program's business: the memory-limit wrapper
    and the exit-status recorder (both Python) keep the standard library's, and the program still
    gets the variable."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for name in ("resource", "signal", "os"):
        (shadow / f"{name}.py").write_text("raise SystemExit('the user module was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow), "PYTHONHOME": str(tmp_path / "no-home")}
    child = spawn(
        ["sh", "-c", 'echo "$PYTHONPATH"'],
        env,
        tmp_path,
        tmp_path / "o",
        tmp_path / "e",
        memory_limit=1 << 30,
        exit_file=tmp_path / STATUS_FILE,
    )
    status = wait_for(child.poll, "the program to end")
    assert status is not None
    assert (status.code, status.signal) == (0, None), (tmp_path / "e").read_text()
    assert (tmp_path / "o").read_text() == f"{shadow}\n"
    assert or_recorded(ExitStatus(None, None), tmp_path / STATUS_FILE) == status
