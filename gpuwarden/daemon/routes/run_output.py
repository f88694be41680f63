"""A run's events and its log output, read by offset, each with an optional long poll."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from gpuwarden.core import run_views
from gpuwarden.core.api import EventsPage, LogChunk
from gpuwarden.core.logtail import NO_LOG, log_chunk, read_log
from gpuwarden.core.run_state import FINAL_STATES
from gpuwarden.daemon.routes.daemon_view import DaemonDep, DaemonView
from gpuwarden.daemon.routes.responses import ON_A_RUN, errors
from gpuwarden.daemon.routes.runs import resolve
from gpuwarden.daemon.routes.waiting import watch_run

MAX_LOG_CHUNK = 1 << 20
MAX_WAIT_S = 30.0
# How often a long poll looks again for what is not announced: a log growing, a run deleted.
RECHECK_S = 0.2
EVENTS_RECHECK_S = 1.0

router = APIRouter()


def _events_page(daemon: DaemonView, run_id: str, since: int, limit: int) -> EventsPage:
    return run_views.events_page(daemon.runs(), run_id, since, limit)


@router.get(
    "/v1/runs/{ref}/events",
    response_model=EventsPage,
    responses=errors(*ON_A_RUN),
    summary="run events with id > since (long-poll with wait)",
)
async def events(
    daemon: DaemonDep,
    ref: str,
    since: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> EventsPage:
    run_id = (await run_in_threadpool(resolve, daemon, ref))["id"]
    async with watch_run(daemon.broadcaster, run_id, wait, EVENTS_RECHECK_S) as watch:
        while True:
            page = await run_in_threadpool(_events_page, daemon, run_id, since, limit)
            ended = page.state in FINAL_STATES or page.state == "deleted"
            if page.events or ended or watch.expired or daemon.stopping:
                return page
            await watch.changed()


def _ended(daemon: DaemonView, run_id: str, number: int) -> bool:
    return run_views.attempt_ended(daemon.runs(), run_id, number)


@router.get(
    "/v1/runs/{ref}/logs",
    response_model=LogChunk,
    responses=errors(*ON_A_RUN),
    summary="a slice of an attempt's stdout/stderr by byte offset",
)
async def logs(
    daemon: DaemonDep,
    ref: str,
    stream: Literal["stdout", "stderr"] = "stdout",
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    offset: Annotated[int | None, Query(ge=-MAX_LOG_CHUNK, le=2**62, description="<0: from the end")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = 65536,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="long-poll for new data")] = 0.0,
) -> LogChunk:
    run = await run_in_threadpool(resolve, daemon, ref)
    number, path = await run_in_threadpool(run_views.log_target, daemon.runs(), run, attempt, stream)
    if path is None:
        return log_chunk(NO_LOG, ended=run["state"] in FINAL_STATES, attempt=0, stream=stream)
    async with watch_run(daemon.broadcaster, run["id"], wait, RECHECK_S) as watch:
        while True:
            piece = await run_in_threadpool(read_log, path, offset, limit)
            if piece.data or watch.expired or daemon.stopping:
                break
            if await run_in_threadpool(_ended, daemon, run["id"], number):
                # Ended while we looked: what it wrote last is in the file now.
                piece = await run_in_threadpool(read_log, path, offset, limit)
                break
            await watch.changed()
    ended = await run_in_threadpool(_ended, daemon, run["id"], number)
    return log_chunk(piece, ended=ended, attempt=number, stream=stream)
