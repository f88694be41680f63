"""One run's work that raised, kept to that run: it fails, and every other run goes on.

The loop does each run's work — a completion a worker handed back, a watched attempt, a queued
run's placement and start — under `contained`. When that work raises, the run fails with one line
saying why, every process that carries its tag is killed (none keeps a GPU with nothing watching
or recording it), and every other run goes on. A UserError says in its own words what the run
asks that cannot be done (a GPU it is pinned to that is not there); anything else is a daemon bug,
whose traceback is logged once per place it was raised, not on every run that meets it.

A write the disk refused (full, over quota, read-only, immutable) is the machine's problem, not
the run's: the run is left as it is and the next pass tries again; the storage health names the
problem in the log and in /v1/health.
"""

from __future__ import annotations

import logging
import sqlite3
import traceback
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise.context import Context

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.supervisor")

DETAIL_CHARS = 200


def contained(ctx: Context, run_id: str, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`work(*args, **kwargs)`, which is run `run_id`'s; None when it raised (the run failed, or
    the disk refused a write and the next pass tries again)."""
    try:
        return work(*args, **kwargs)
    except Exception as exc:
        if refused_write(ctx, exc):
            log.debug("run %s: a write was refused (%s); the next pass tries again", run_id, exc)
        else:
            fail(ctx, run_id, exc)
        return None


def refused_write(ctx: Context, exc: BaseException) -> bool:
    """Whether `exc` is a write the disk refused (then noted for /v1/health and the log)."""
    return ctx.health.report(exc, database=isinstance(exc, sqlite3.Error))


def first_time(ctx: Context, exc: BaseException) -> bool:
    """Whether a bug raised where `exc` was is new to this daemon (then its traceback is logged)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = (frames[-1].filename, frames[-1].lineno or 0) if frames else ("", 0)
    key = (type(exc).__qualname__, *where)
    new = key not in ctx.bugs_seen
    ctx.bugs_seen.add(key)
    return new


def fail(ctx: Context, run_id: str, exc: Exception) -> None:
    """Stop watching the run, kill its processes and fail it, saying why in one line."""
    why = _logged(ctx, run_id, exc)
    ctx.active.pop(run_id, None)
    ctx.held.pop(run_id, None)
    ctx.not_before.pop(run_id, None)
    # Each step on its own: processes that cannot be listed still leave the run recorded, and
    # a record that cannot be written is said once while the other runs go on.
    try:
        if _kill(ctx, run_id):
            why += "; its processes were killed"
    except Exception as again:
        log.error("run %s: could not kill its processes: %s", run_id, describe(again))
    try:
        _record(ctx, run_id, why)
    except Exception as again:
        log.error("run %s: could not record that it failed: %s", run_id, describe(again))


def _logged(ctx: Context, run_id: str, exc: Exception) -> str:
    """Why the run fails, logged: a UserError's own words (the run's input or machine cannot do
    what it asks, and the message says the fix), else a daemon bug."""
    if isinstance(exc, UserError):
        why = one_line(exc)
        log.warning("run %s: %s", run_id, why)
        return why
    why = f"the daemon failed while supervising the run ({describe(exc)}; a daemon bug, see its log)"
    log.error("run %s: %s", run_id, why, exc_info=exc if first_time(ctx, exc) else None)
    return why


def describe(exc: BaseException) -> str:
    """`Type: message` on one line, the message cut to DETAIL_CHARS."""
    detail = one_line(exc) if str(exc).strip() else ""
    if len(detail) > DETAIL_CHARS:
        detail = detail[: DETAIL_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _kill(ctx: Context, run_id: str) -> bool:
    """Kill every live process carrying the run's tag (its attempt, what that started, its
    probes), found by the tag rather than a pid: the one the run's handle knew may have been
    reused, and one spawned but not yet watched is found too. True when there were any."""
    processes = ctx.backends.processes
    mine = [p for p in processes.tagged() if p.run_id == run_id]
    if mine:
        processes.kill(mine)
    return bool(mine)


def _record(ctx: Context, run_id: str, why: str) -> None:
    """End the run's unfinished attempt with `why` and fail the run (unless it already settled)."""
    run = ctx.find(run_id)
    if run is None:
        return  # deleted: nothing to record
    number = int(run["attempt"] or 0)
    attempt = ctx.store(lambda s: s.attempt(run_id, number)) if number else None
    message = why
    if attempt is not None and attempt["state"] != "ended":
        ended = ctx.clock()
        ctx.store(
            lambda s: s.update_attempt(
                run_id, number, state="ended", ended_at=ended, classification="failed", reason=why
            )
        )
        message = f"attempt {number}: {why}"
    if not RunState(run["state"]).final:
        ctx.set_state(run_id, RunState.FAILED, message)
