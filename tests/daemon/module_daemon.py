"""One daemon for all the tests of a module, where none of them needs a fresh one: starting a
daemon costs about a second of CPU, more than many of those tests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.daemon.conftest import DaemonHandle


@contextlib.contextmanager
def module_daemon(root: Path, extra_env: dict[str, str] | None = None) -> Iterator[DaemonHandle]:
    """A started daemon (two fake H100s unless `extra_env` says otherwise) under `root`; stopped,
    with every run it started killed, on the way out."""
    runtime = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))  # a short socket path
    handle = DaemonHandle(root, runtime, extra_env)
    handle.start()
    try:
        yield handle
    finally:
        try:
            handle.stop()
        finally:
            handle.kill_runs()
            shutil.rmtree(runtime, ignore_errors=True)
