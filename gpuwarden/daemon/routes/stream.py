"""The live stream: Server-Sent Events of sample, run and event frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from gpuwarden.core.errors import UserError
from gpuwarden.daemon.routes.daemon_view import DaemonDep
from gpuwarden.daemon.routes.responses import ON_A_RUN, json_errors
from gpuwarden.daemon.routes.runs import resolve
from gpuwarden.daemon.stream import FRAME_TYPES

_KIND = "(" + "|".join(FRAME_TYPES) + ")"
# What the handler accepts, said for the OpenAPI description: kinds between commas, blanks and
# empty items ignored, at least one kind.
KINDS_PATTERN = rf"^[ \t,]*{_KIND}[ \t]*(,[ \t,]*({_KIND}[ \t]*)?)*$"

router = APIRouter()


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


_FRAMES = (
    "`event: sample|run|event` and one JSON `data:` line per frame (a run frame is a RunSummary, an "
    "event frame a RunEvent with `run_id`, a sample frame a SampleBody), each with `dropped`: the "
    "frames this client missed by reading too slowly; a `: keepalive` comment when idle"
)


@router.get(
    "/v1/stream",
    response_class=EventStream,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": _FRAMES},
        **json_errors(*ON_A_RUN),
    },
    summary="Server-Sent Events: sample, run and event frames",
)
async def stream(
    daemon: DaemonDep,
    kinds: Annotated[
        str,
        Query(
            max_length=64,
            description="comma list of sample, run, event",
            json_schema_extra={"pattern": KINDS_PATTERN},
        ),
    ] = "sample,run,event",
    run: Annotated[str | None, Query(max_length=200, description="only this run's run/event frames")] = None,
) -> StreamingResponse:
    wanted = [k.strip(" \t") for k in kinds.split(",") if k.strip(" \t")]
    bad = [k for k in wanted if k not in FRAME_TYPES]
    if bad or not wanted:
        raise UserError(
            f"kinds: unknown frame kind {bad[0] if bad else '(none)'} — use {', '.join(FRAME_TYPES)}"
        )
    run_id = (await run_in_threadpool(resolve, daemon, run))["id"] if run else None
    broadcaster = daemon.broadcaster
    client = broadcaster.subscribe(asyncio.get_running_loop(), wanted, run_id)

    async def body() -> AsyncIterator[str]:
        try:
            async for text in client.frames():
                yield text
        finally:
            broadcaster.unsubscribe(client)

    return EventStream(body(), headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
