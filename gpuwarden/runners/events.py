"""Writing the runner → daemon event stream (`events.jsonl`), one JSON line per event.

The daemon tails the file from a remembered offset, so every event is written as one complete
line with a single `write` call and flushed at once. A full disk (or any OS error) must not turn
into a crash in the middle of training: the writer reports the first failure on stderr once and
then drops events until writes succeed again.

In a multi-process run every rank has a writer of its own (its own file, see
`gpuwarden.core.gang.files`), which stamps the rank on each event.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO

from gpuwarden.core.events import Event, encode


class EventWriter:
    """Append-only, line-buffered writer of protocol events to `path` (parents created)."""

    def __init__(self, path: Path, rank: int | None = None) -> None:
        self.path = path
        self.rank = rank
        self.last_failure: Event | None = None  # the last `oom` or `error` event written
        self._failed = False
        path.parent.mkdir(parents=True, exist_ok=True)
        # Append mode: a restarted attempt that reuses the file never truncates earlier lines.
        self._fh: IO[str] | None = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def emit(self, event: Event) -> None:
        """Write `event` as one line and flush; never raises for I/O errors."""
        if self._fh is None:
            return
        if self.rank is not None and event.rank is None:
            event = event.model_copy(update={"rank": self.rank})
        if event.type in ("oom", "error"):
            self.last_failure = event
        line = encode(event) + "\n"
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:
            if not self._failed:
                self._failed = True
                print(f"gpuwarden: cannot write events to {self.path}: {exc}", file=sys.stderr, flush=True)
            return
        self._failed = False

    def fsync(self) -> None:
        """Force written events to disk (before exiting with a status the daemon acts on)."""
        if self._fh is None:
            return
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError:
            pass

    def close(self) -> None:
        """Flush, sync and close; later `emit` calls are ignored."""
        if self._fh is None:
            return
        self.fsync()
        with contextlib.suppress(OSError):
            self._fh.close()
        self._fh = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
