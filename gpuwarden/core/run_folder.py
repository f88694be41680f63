"""A run folder a `gpuwarden exec` keeps: where its store and its lock are, and whether an exec
is alive in it.

The folder holds the run's whole record (`run.db`, written by its one exec), its attempts' files,
and `exec.lock`, an flock the exec holds while it lives (the kernel drops it when the process
dies, even after kill -9), with `exec.pid` saying who holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

STORE_NAME = "run.db"
LOCK_NAME = "exec.lock"
PID_NAME = "exec.pid"


def run_store_path(run_dir: Path) -> Path:
    """Where a run folder keeps its record."""
    return run_dir / STORE_NAME


def lock_path(run_dir: Path) -> Path:
    return run_dir / LOCK_NAME


def supervised(run_dir: Path) -> bool:
    """Whether a live `gpuwarden exec` holds the folder (its lock is held). A folder no exec holds
    has a record that stopped where its exec died (a job killed, a node lost). The probe holds a
    shared lock for an instant; a starting exec waits that out (`job/lock.py`)."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return False


def gone_message(run_dir: Path, state: str) -> str:
    """What a run still active in its record says once no exec holds its folder."""
    return f"its gpuwarden exec is gone (was {state}) — gpuwarden exec --run {run_dir} takes it up"
