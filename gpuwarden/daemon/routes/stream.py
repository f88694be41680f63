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
from gpuwarden.daemon.routes.runs import resolve
from gpuwarden.daemon.stream import FRAME_TYPES

router = APIRouter()


@router.get("/v1/stream", summary="Server-Sent Events: sample, run and event frames")
async def stream(
    daemon: DaemonDep,
    kinds: Annotated[
        str, Query(max_length=64, description="comma list of sample, run, event")
    ] = "sample,run,event",
    run: Annotated[str | None, Query(max_length=200, description="only this run's run/event frames")] = None,
) -> StreamingResponse:
    wanted = [k.strip() for k in kinds.split(",") if k.strip()]
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

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
