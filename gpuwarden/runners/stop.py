"""Cooperative stop on SIGTERM/SIGINT: the handler only sets a flag; loops poll it at safe points.

The daemon stops a run with SIGTERM to its process group, waits a grace period, then SIGKILLs.
Raising from a signal handler could interrupt an optimizer step half-applied, so the handler
never raises: the training loop checks `requested` between optimizer steps, writes a checkpoint
(reason "sigterm") and exits with EXIT_TERMINATED.
"""

from __future__ import annotations

import signal
from types import FrameType


class StopRequest:
    """A flag set by SIGTERM (or SIGINT); `install()` registers the handlers."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signum = signum

    def install(self) -> StopRequest:
        """Route SIGTERM and SIGINT to this flag (main thread only); returns self."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self


# One per process: the entry point installs it, runner bodies read it.
STOP = StopRequest()
