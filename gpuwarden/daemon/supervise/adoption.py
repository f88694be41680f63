"""After a daemon restart: adopt the attempts that still run, and say what became of the rest.

A live attempt is watched again from the events offset the store remembers. One whose process is
gone is handed back to the loop to be finished (what it wrote while no daemon watched decides);
a run caught between attempts is interrupted, and resumed when its spec says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.process import ExitStatus
from gpuwarden.daemon.supervise.context import DECISIVE_EVENTS, Active, Context
from gpuwarden.daemon.supervise.pump import pump

log = logging.getLogger("gpuwarden.daemon.supervisor")

GONE = "process gone after a daemon restart"  # the run's and the attempt's message


@dataclass(frozen=True)
class Gone:
    """An attempt whose process ended while no daemon watched, with a final event to go by."""

    active: Active
    status: ExitStatus
    note: str


def adopt_live(ctx: Context) -> list[Gone]:
    """Watch every attempt that still runs; return those that ended with a decisive event."""
    gone: list[Gone] = []
    for attempt in ctx.store(lambda s: s.live_attempts()):
        found = _adopt(ctx, attempt)
        if found is not None:
            gone.append(found)
    return gone


def settle_between_attempts(ctx: Context, skip: set[str]) -> None:
    """Runs still marked active that have no attempt to watch (retuning with no live attempt,
    starting before the spawn): interrupted, or resumed when their spec says so."""
    for run in ctx.store(lambda s: s.list_runs(states=ACTIVE_STATES)):
        if run["id"] not in ctx.active and run["id"] not in skip:
            interrupted(ctx, run)


def _adopt(ctx: Context, attempt: Mapping[str, Any]) -> Gone | None:
    run = ctx.find(attempt["run_id"])
    if run is None:
        return None
    pid, create_time = int(attempt["pid"] or 0), float(attempt["create_time"] or 0)
    active = Active(
        run_id=run["id"],
        attempt=attempt["attempt"],
        child=ctx.backends.processes.adopt(pid, create_time),
        tail=EventsTail(Path(attempt["events_path"]), attempt["events_offset"]),
        gpus=list(attempt["gpus"]),
        stderr_path=Path(attempt["stderr_path"]),
        oom_before=attempt["oom_kill_before"],
        stop_requested=bool(run["stop_requested"]),
    )
    last = ctx.store(lambda s: s.last_event(run["id"], active.attempt, DECISIVE_EVENTS))
    active.decisive_event = last["type"] if last else None
    if pid and create_time and active.child.poll() is None:
        _watch_again(ctx, run, active)
        return None
    # The process is gone: what it wrote while no daemon watched decides.
    pump(ctx, active, final=True)
    if active.decisive_event in DECISIVE_EVENTS:
        return Gone(active, ExitStatus(code=None, signal=None), "ended while the daemon was down")
    ended = ctx.clock()
    ctx.store(
        lambda s: s.update_attempt(
            run["id"],
            active.attempt,
            state="ended",
            ended_at=ended,
            classification="interrupted",
            reason=GONE,
        )
    )
    return None


def _watch_again(ctx: Context, run: Mapping[str, Any], active: Active) -> None:
    run_id, pid = str(run["id"]), active.child.pid
    ctx.active[run_id] = active
    ctx.store(lambda s: s.update_attempt(run_id, active.attempt, adopted=1, state="running"))
    ctx.event(run_id, active.attempt, "adopted", pid=pid)
    if run["state"] != RunState.RUNNING:
        ctx.set_state(run_id, RunState.RUNNING, f"re-adopted pid {pid} after a daemon restart")
    log.info("run %s: re-adopted pid %s", run_id, pid)
    pump(ctx, active)


def interrupted(ctx: Context, run: Mapping[str, Any]) -> None:
    run_id = str(run["id"])
    if run["stop_requested"]:
        ctx.set_state(run_id, RunState.STOPPED, f"stop was requested; {GONE}")
    elif run["spec"].get("on_interrupt") == "resume":
        ctx.set_state(run_id, RunState.INTERRUPTED, f"{GONE}; resuming")
        ctx.set_state(run_id, RunState.QUEUED, "resuming after an interruption (on_interrupt: resume)")
    else:
        ctx.set_state(run_id, RunState.INTERRUPTED, f"{GONE} — `gpuwarden resume` it")
