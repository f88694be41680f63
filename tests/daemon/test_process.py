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

from gpuwarden.daemon.process import RUN_TAG, LocalProcesses, run_tag
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
