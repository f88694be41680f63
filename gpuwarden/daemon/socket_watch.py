"""The API socket's file, watched: a daemon whose socket was removed cannot be reached any more.

A cleaner of /tmp or /run, or a user tidying up, can delete the runtime folder under a running
daemon. The listening socket keeps working, but no client can find it: `status` says the daemon is
down, `down` cannot stop it, and `up` is refused because it still holds the database. So the daemon
stops when its socket's file is gone or is no longer the one it bound; runs keep running and the
next daemon re-adopts them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gpuwarden.daemon")

CHECK_EVERY_S = 2.0


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at `path` now, without following a link; None when nothing is."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class SocketWatch:
    """Calls `on_lost` once, from its own thread, when `path` no longer is the socket bound there."""

    def __init__(self, path: Path, on_lost: Callable[[], None]) -> None:
        self.path = path
        self.bound = file_id(path)
        self.lost = False
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="socket-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def remove_socket(self) -> None:
        """Stop watching and remove the socket's file, unless it is another daemon's by now."""
        self._stop.set()
        if self.still_ours():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def still_ours(self) -> bool:
        return self.bound is not None and file_id(self.path) == self.bound

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            if self.still_ours():
                continue
            self.lost = True
            log.warning(
                "the API socket %s was removed (its folder deleted?): no client can reach this daemon,"
                " so it stops; runs keep running — `gpuwarden up` starts one that can be reached",
                self.path,
            )
            self._on_lost()
            return
