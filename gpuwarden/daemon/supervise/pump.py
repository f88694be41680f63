"""Moving what an attempt appended to its events.jsonl into the store and the live stream."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.events import decode
from gpuwarden.daemon.supervise.context import DECISIVE_EVENTS, Active, Context


def pump(ctx: Context, active: Active, final: bool = False) -> None:
    """Store new complete lines with the offset they end at, in one transaction per chunk.

    `final`: the writer has exited, so a last line without a newline counts too.
    """
    while True:
        chunk = active.tail.read(final=final)
        if chunk is None:
            return
        events = [e for e in (decode(line) for line in chunk.lines) if e is not None]
        skipped = len(chunk.lines) - len(events)
        end = chunk.end_offset
        ids = _store(ctx, active, events, end, skipped)
        active.tail.commit(end)
        for event_id, event in zip(ids, events, strict=True):
            if event["type"] in DECISIVE_EVENTS:
                active.decisive_event = event["type"]
            frame = {"run_id": active.run_id, "id": event_id, "attempt": active.attempt, "source": "runner"}
            ctx.broadcaster.publish("event", {**frame, **event}, active.run_id)
        if not chunk.more:
            return


def _store(ctx: Context, active: Active, events: list[dict[str, Any]], end: int, skipped: int) -> list[int]:
    return ctx.store(lambda s: s.add_events(active.run_id, active.attempt, events, end, skipped))
