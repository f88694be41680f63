"""Stopping a whole gang at once, when one rank failed on its own or the gang hung.

SIGTERM to torchrun's process group (torchrun passes it to its ranks), then, after a short grace,
SIGKILL to torchrun's group and to every rank's (the loop does that at `kill_at`; the ranks also
die with torchrun, which they ask the kernel for). Nothing waits for a collective to time out:
the other ranks of a gang whose rank is gone cannot write a consistent checkpoint anyway, and the
next attempt resumes from the last complete one.
"""

from __future__ import annotations

import logging
import signal

from gpuwarden.daemon.supervise.context import Active, Context, GangStop

log = logging.getLogger("gpuwarden.daemon.supervisor")

GANG_GRACE_S = 2.0


def stop_gang(ctx: Context, active: Active, stop: GangStop) -> None:
    """Record why, SIGTERM the gang now and have the loop SIGKILL what is left after the grace."""
    if active.gang_stop is not None:
        return
    active.gang_stop = stop
    log.info("run %s attempt %d: stopping the gang (%s)", active.run_id, active.attempt, stop.reason)
    # Owed if the store refuses it: the gang is stopped all the same.
    ctx.owe(
        ctx.batch().event(
            active.run_id,
            active.attempt,
            "gang_stopping",
            cause=stop.cause,
            rank=stop.rank,
            reason=stop.reason,
            grace_seconds=GANG_GRACE_S,
        )
    )
    deadline = ctx.clock() + GANG_GRACE_S
    active.kill_at = deadline if active.kill_at is None else min(active.kill_at, deadline)
    active.child.signal_group(signal.SIGTERM)


def kill_now(active: Active) -> None:
    """SIGKILL the attempt: its process group, and for a gang every rank's group too."""
    if active.gang:
        active.child.signal_tree(signal.SIGKILL)
    else:
        active.child.signal_group(signal.SIGKILL)
