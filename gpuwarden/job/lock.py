"""One `gpuwarden exec` per run: a second one on the same run folder (a job started twice, a
requeue while the first still ends) would be a second writer of its store."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from gpuwarden.core.errors import UserError


class RunLock:
    """An exclusive flock on the run folder's `exec.lock`, held until the process exits (the
    kernel drops it then, even after kill -9); `exec.pid` says who holds it, for the message."""

    def __init__(self, lock_file: Path, pid_file: Path) -> None:
        self.lock_file = lock_file
        self.pid_file = pid_file
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise UserError(
                f"{self.lock_file}: cannot open the run's lock ({exc.strerror or exc}) — the run "
                "folder must be one you can write"
            ) from None
        if not _take(fd):
            os.close(fd)
            raise UserError(
                f"{self.lock_file.parent}: another gpuwarden exec supervises this run ({self._holder()})"
                " — wait until it ends, or stop it",
                code="already_running",
            ) from None
        self._fd = fd
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()} {socket.gethostname()}\n")
        os.replace(tmp, self.pid_file)

    def _holder(self) -> str:
        try:
            pid, host = self.pid_file.read_text().split()[:2]
        except (OSError, ValueError):
            return "its pid is not known"
        return f"pid {pid} on {host}"


# A reader (`ps --runs`) probes the lock for a moment to tell a live exec from a dead one: a new
# exec gives such a probe this long before it decides that another exec holds the run.
PROBE_PATIENCE_S = 2.0


def _take(fd: int) -> bool:
    deadline = time.monotonic() + PROBE_PATIENCE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
