"""Test hook, not a user feature: hold a runner at a known step until it is asked to stop.

`GPUWARDEN_TEST_PAUSE=RANK:STEP` makes rank RANK (0 for a run of one process) wait once it has
completed STEP steps — a training run's optimizer steps, an inference run's batches, counted over
every attempt — until SIGTERM or SIGINT sets the stop flag. A training rank waits inside the next
step, after drawing its micro-batches and before the stop is agreed on; an inference run before
its next batch. The runner then goes on, so its own stop check meets the request exactly as one
that arrived at that point of a step. SIGKILL ends a waiting runner like a working one.

Tests that stop a run in the middle use it: the signal lands at the same step however slow the
machine is, so the run needs few steps. Nothing else should set it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from gpuwarden.runners.stop import StopRequest

PAUSE_ENV = "GPUWARDEN_TEST_PAUSE"
# How often the wait looks at the flag (a signal handler does not cut a sleep short: PEP 475).
POLL_S = 0.02


def rank_step(name: str, rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """STEP of a `RANK:STEP` hook variable `name` when it names this rank, else None (unset,
    another rank, or malformed)."""
    value = (os.environ if environ is None else environ).get(name, "")
    which, _, step = value.partition(":")
    if not (which.isdigit() and step.isdigit()) or int(which) != rank:
        return None
    return int(step)


def pause_step(rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The step after which this rank waits for a stop request, or None."""
    return rank_step(PAUSE_ENV, rank, environ)


def wait_for_stop(stop: StopRequest) -> None:
    """Return once `stop` has been requested."""
    while not stop.requested:
        time.sleep(POLL_S)
