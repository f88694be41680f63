"""Stopping a gang at once: torchrun starts each rank in a session of its own, so the signal must
reach every group in torchrun's tree, not only torchrun's own."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuwarden.daemon.process import process_alive, spawn

# A parent that starts a child in a new session (as torchrun starts a rank) and waits.
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_signal_tree_reaches_children_in_sessions_of_their_own(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    parent = spawn(
        [sys.executable, "-c", TREE], {"PATH": "/usr/bin:/bin"}, tmp_path, out, tmp_path / "err.log"
    )
    deadline = time.monotonic() + 60
    while not out.read_text().strip():
        assert time.monotonic() < deadline, (tmp_path / "err.log").read_text()
        time.sleep(0.02)
    child = int(out.read_text().split()[0])
    try:
        assert parent.signal_group(0) and process_alive(child, None)
        assert parent.signal_tree(signal.SIGKILL)
        deadline = time.monotonic() + 60
        while process_alive(child, None) or parent.poll() is None:
            assert time.monotonic() < deadline, "the child in its own session survived"
            time.sleep(0.02)
        assert parent.poll() is not None and parent.poll().signal == signal.SIGKILL  # type: ignore[union-attr]
        assert not parent.signal_tree(signal.SIGKILL)  # nothing left
    finally:
        subprocess.run(["kill", "-9", str(child)], capture_output=True, check=False)
