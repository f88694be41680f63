"""Test hook, not a user feature: make one rank stop making progress, as a hung rank would.

`GPUWARDEN_TEST_STALL=RANK:STEP` makes the rank RANK sleep forever once it has completed STEP
optimizer steps (before it joins the next step's exchange), so the other ranks block in their
collective. Tests of hang detection use it; nothing else should set it. A one-process run is
rank 0: a test that must kill a run at a known step (after the checkpoint of that step) stalls it
there. A process resumed from the checkpoint of STEP itself goes on: the attempt restarted after
that kill runs to the end with the same environment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from gpuwarden.runners.pause_hook import rank_step

STALL_ENV = "GPUWARDEN_TEST_STALL"


def stall_step(rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The step at which this rank stalls, or None (unset, another rank, or malformed)."""
    return rank_step(STALL_ENV, rank, environ)


def stall_forever() -> None:
    """Sleep until killed (signals still run their handlers, as in a real hang)."""
    while True:
        time.sleep(3600)
