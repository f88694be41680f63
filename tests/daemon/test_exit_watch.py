"""The supervisor is told when an attempt's process ends, as it ends, without the end being taken
from the attempt's own handle: its exit status is still read from it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from gpuwarden.daemon.exit_watch import call_on_exit
from gpuwarden.daemon.process import LocalProcesses, process_alive


def test_the_callback_comes_when_a_real_process_ends_and_its_status_stays_readable() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(7)"], stdin=subprocess.PIPE
    )
    ended = threading.Event()
    try:
        call_on_exit(child.pid, lambda: process_alive(child.pid, None), ended.set)
        assert not ended.is_set()  # it runs: waiting on its stdin
        assert child.stdin is not None
        child.stdin.close()
        assert ended.wait(30), "the watch was not told the process ended"
        assert child.wait(timeout=30) == 7  # not reaped by the watch: its status is the program's
    finally:
        child.kill()
        child.wait()


def test_a_process_already_gone_or_replaced_calls_at_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    calls: list[str] = []
    # Gone: no such pid, or (on a busy machine) the pid is another process's already.
    call_on_exit(child.pid, lambda: process_alive(child.pid, started), lambda: calls.append("gone"))
    # A live pid that is not the process meant (its pid was reused): ended, as far as the watch goes.
    call_on_exit(os.getpid(), lambda: False, lambda: calls.append("replaced"))
    assert calls == ["gone", "replaced"]


def test_the_local_process_layer_watches_a_child_it_spawned(tmp_path: Path) -> None:
    folder = tmp_path
    layer = LocalProcesses()
    child = layer.spawn([sys.executable, "-c", "pass"], {}, folder, folder / "out", folder / "err")
    ended = threading.Event()
    layer.on_exit(child, ended.set)
    assert ended.wait(30)
    assert child.popen is not None and child.popen.wait(timeout=30) == 0
