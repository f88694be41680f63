"""`gpuwarden logs RUN -f`: a run's output as it comes, through every attempt until the run has
ended (a retune or a restart goes on in the next attempt), each new one announced on stderr.
From the daemon or from run folders (`--runs DIR`): both are a `RunReader`."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from gpuwarden.client.reader import RunReader
from gpuwarden.core.api import LogChunk
from gpuwarden.core.attempt_heading import attempt_heading
from gpuwarden.core.oom.roles import world_size_of
from gpuwarden.core.run_state import FINAL_STATES

WAIT_S = 5.0  # each long poll; a follower gives up only when the run has ended
EVENTS_PAGE = 10_000

Show = Callable[[LogChunk], None]


def follow_logs(
    client: RunReader, ref: str, stream: str, chunk: LogChunk, *, every_attempt: bool, show: Show
) -> list[LogChunk]:
    """What comes after `chunk` (each shown as it comes): until its attempt has ended, or with
    `every_attempt` until the run has, each next attempt from its start."""
    got: list[LogChunk] = []
    while True:
        while chunk.attempt and not chunk.eof:
            chunk = client.logs(
                ref, stream=stream, attempt=chunk.attempt, offset=chunk.next_offset, wait=WAIT_S
            )
            got.append(chunk)
            show(chunk)
        number = _next_attempt(client, ref, chunk.attempt) if every_attempt else None
        if number is None:
            return got
        chunk = client.logs(ref, stream=stream, attempt=number, offset=0)
        got.append(chunk)
        show(chunk)


def _next_attempt(client: RunReader, ref: str, after: int) -> int | None:
    """The first attempt after `after`, once it has started (announced on stderr); None when
    the run ended without one. Waits on the run's events: a new attempt is one."""
    since = _newest_event(client, ref)
    while True:
        detail = client.run(ref)
        later = [a.attempt for a in detail.attempts if a.attempt > after]
        if later:
            number = min(later)
            heading = attempt_heading(number, detail.attempts, detail.retunes, world_size_of(detail.spec))
            click.echo(heading, err=True)
            sys.stderr.flush()
            return number
        if detail.state in FINAL_STATES:
            return None
        since = client.events(detail.id, since=since, wait=WAIT_S).next_since


def _newest_event(client: RunReader, ref: str) -> int:
    """The id of the run's newest event, to wait for the ones after it."""
    since = 0
    while True:
        page = client.events(ref, since=since, limit=EVENTS_PAGE)
        if len(page.events) < EVENTS_PAGE:
            return page.next_since
        since = page.next_since
