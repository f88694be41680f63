"""Moving what an attempt appended to its events files into the store and the live stream.

A one-process attempt has one file; a gang one per rank (rank 0's is the attempt's events.jsonl),
each read from its own offset and stored with it. A gang's progress also feeds the hang
watchdog, and a rank's own failure (`oom`, or an `error` that is not `gang_aborted`) is kept as
the attempt's failure while it runs, for the loop to stop the whole gang at once.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.core.events import decode
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.supervise.context import DECISIVE_EVENTS, Active, Context


def pump(ctx: Context, active: Active, final: bool = False) -> None:
    """Store new complete lines of every file with the offset they end at, one transaction per
    chunk. `final`: the writers have exited, so a last line without a newline counts too."""
    _pump_file(ctx, active, active.tail, 0, final)
    for rank, tail in active.rank_tails.items():
        _pump_file(ctx, active, tail, rank, final)


def _pump_file(ctx: Context, active: Active, tail: EventsTail, rank: int, final: bool) -> None:
    while True:
        chunk = tail.read(final=final)
        if chunk is None:
            return
        events = [e for e in (decode(line) for line in chunk.lines) if e is not None]
        skipped = len(chunk.lines) - len(events)
        end = chunk.end_offset
        ids = _store(ctx, active, events, end, skipped, rank)
        tail.commit(end)
        now = ctx.clock()
        for event_id, event in zip(ids, events, strict=True):
            remember(active, event, rank, now)
            frame = {"run_id": active.run_id, "id": event_id, "attempt": active.attempt, "source": "runner"}
            ctx.broadcaster.publish("event", {**frame, **event}, active.run_id)
        if not chunk.more:
            return


def remember(active: Active, event: dict[str, Any], rank: int, now: float) -> None:
    """What the loop keeps from an event: the attempt's last decisive event, and for a gang the
    ranks' progress and the first rank that failed on its own."""
    type_ = event["type"]
    if type_ == "progress":
        active.bar.own_progress = True  # its own report, not the bar it draws, says how far it is
    if not active.gang:
        if type_ in DECISIVE_EVENTS:
            active.decisive_event = type_
        return
    if type_ == "progress" and active.steps is not None and isinstance(event.get("step"), int):
        active.steps.observe(rank, int(event["step"]), float(event["ts"]), now)
    if type_ == "started" and isinstance(event.get("pid"), int):
        active.rank_pids[rank] = int(event["pid"])
    aborted = type_ == "error" and event.get("code") == "gang_aborted"
    # rank 0 speaks for the gang when it finishes; any rank's own failure is the gang's
    speaks = type_ in DECISIVE_EVENTS and not aborted and (rank == 0 or type_ != "finished")
    if speaks and active.decisive_event not in ("oom", "error"):
        active.decisive_event = type_
    if type_ in ("oom", "error") and not aborted and active.failed_rank is None:
        active.failed_rank = rank


def _store(
    ctx: Context, active: Active, events: list[dict[str, Any]], end: int, skipped: int, rank: int
) -> list[int]:
    return ctx.store(lambda s: s.add_events(active.run_id, active.attempt, events, end, skipped, rank))
