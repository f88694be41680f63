"""After a daemon restart: adopt the attempts that still run, and say what became of the rest.

A live attempt is watched again from the events offsets the store remembers (a gang's: one per
rank), found by its recorded pid or, when the daemon died between spawning it and recording the
pid, by its run tag (its exit-status recorder: the earliest of the attempt's session leaders, as
each rank of a gang leads one too). One whose process is gone goes back to the loop to be finished
as if this daemon had watched it end: the exit status its recorder wrote (for a gang, torchrun's,
with the ranks' own evidence in their files), else what it wrote while no daemon watched, decides;
with neither (its recorder died with it: a reboot) it is interrupted. A run caught retuning goes
back to the loop to decide its retune again, and one whose attempt's ending was recorded follows
that ending; other runs caught between attempts are interrupted, and resumed when their spec says
so. Every other process that carries the tag of one of this daemon's runs (probes, strays) is
killed: nothing a run started outlives what it was started for.
"""

from __future__ import annotations

import logging
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import EXIT_TERMINATED
from gpuwarden.core.gang.watchdog import StepWatch, step_watch
from gpuwarden.core.run_state import ACTIVE_STATES, RunState
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.process import ExitStatus, Tagged, or_recorded
from gpuwarden.daemon.supervise.context import DECISIVE_EVENTS, Active, Context
from gpuwarden.daemon.supervise.pump import pump, remember

log = logging.getLogger("gpuwarden.daemon.supervisor")

GONE = "process gone after a daemon restart"  # the run's and the attempt's message


@dataclass(frozen=True)
class Gone:
    """An attempt whose process ended while no daemon watched, with a final event to go by."""

    active: Active
    status: ExitStatus
    note: str


@dataclass(frozen=True)
class Unfinished:
    """A run that was retuning when the daemon died: its failed attempt, as recorded."""

    run_id: str
    attempt: dict[str, Any]


@dataclass
class Adoption:
    """What the loop still has to do after adopting: finish these attempts, decide these retunes."""

    gone: list[Gone] = field(default_factory=list)
    retunes: list[Unfinished] = field(default_factory=list)
    ended: list[Unfinished] = field(default_factory=list)  # finished, but the run not moved on


def adopt(ctx: Context) -> Adoption:
    """Watch live attempts, kill leftovers, settle the runs caught between attempts."""
    found = ctx.backends.processes.tagged()
    out = Adoption()
    for attempt in ctx.store(lambda s: s.live_attempts()):
        gone = _adopt(ctx, attempt, found)
        if gone is not None:
            out.gone.append(gone)
    _kill_leftovers(ctx, found)
    out.retunes, out.ended = _between_attempts(ctx, skip={g.active.run_id for g in out.gone})
    _restore_backoffs(ctx)
    return out


def _between_attempts(ctx: Context, skip: set[str]) -> tuple[list[Unfinished], list[Unfinished]]:
    """Settle the runs still marked active that have no attempt to watch; return the retunes
    to decide again and the attempts whose recorded ending the run has still to follow."""
    retunes, ended = [], []
    for run in ctx.store(lambda s: s.list_runs(states=ACTIVE_STATES)):
        if run["id"] in ctx.active or run["id"] in skip:
            continue
        if run["state"] == RunState.RETUNING:
            if (unfinished := _retuning(ctx, run)) is not None:
                retunes.append(unfinished)
        elif (finished := _finished(ctx, run)) is not None:
            ended.append(finished)
        else:
            interrupted(ctx, run)  # starting before the spawn, or probing for an autotune
    return retunes, ended


def _finished(ctx: Context, run: Mapping[str, Any]) -> Unfinished | None:
    """A running run whose attempt the previous daemon finished and recorded (out of memory,
    succeeded, failed) just before it died: the run follows that ending, not "interrupted"."""
    if run["state"] != RunState.RUNNING:
        return None
    run_id = str(run["id"])
    attempt = ctx.store(lambda s: s.attempt(run_id, int(run["attempt"])))
    if attempt is None or attempt["state"] != "ended" or attempt["classification"] in (None, "interrupted"):
        return None
    return Unfinished(run_id, attempt)


def _adopt(ctx: Context, attempt: Mapping[str, Any], found: Sequence[Tagged]) -> Gone | None:
    run = ctx.find(attempt["run_id"])
    if run is None:
        return None
    run_id, number = str(run["id"]), int(attempt["attempt"])
    pid, create_time = int(attempt["pid"] or 0), float(attempt["create_time"] or 0)
    if not pid:
        pid, create_time = _unrecorded(ctx, run_id, number, found)
    world = int(attempt.get("world_size") or 1)
    offsets = ctx.store(lambda s: s.rank_offsets(run_id, number)) if world > 1 else {}
    child = ctx.backends.processes.adopt(pid, create_time)
    nodes = _nodes(run)
    machines = ctx.backends.machines
    if nodes > 1 and machines is not None and machines.count == nodes:
        # The other machines' parts of the attempt run on: watched again with this one's.
        child = machines.watch(child, Path(attempt["stderr_path"]).parent)
    active = Active(
        run_id=run_id,
        attempt=number,
        child=child,
        tail=EventsTail(Path(attempt["events_path"]), attempt["events_offset"]),
        gpus=list(attempt["gpus"]),
        stderr_path=Path(attempt["stderr_path"]),
        oom_before=attempt["oom_kill_before"],
        stop_requested=bool(run["stop_requested"]),
        world_size=world,
        nodes=nodes,
        rank_tails={rank: EventsTail(Path(path), offset) for rank, (path, offset) in offsets.items()},
        steps=_step_watch(run, world),
    )
    ctx.backends.processes.on_exit(child, ctx.wake)
    _recall(ctx, active)
    if pid and create_time and active.child.poll() is None:
        _watch_again(ctx, run, active)
        return None
    # The process is gone: its recorded exit status, else what it wrote while no daemon watched, decides.
    pump(ctx, active, final=True)
    status = or_recorded(ExitStatus(code=None, signal=None), active.exit_file)
    shut_down = _asked_to_end(status) and active.decisive_event not in DECISIVE_EVENTS
    if not shut_down and (status.known or active.decisive_event in DECISIVE_EVENTS):
        return Gone(active, status, "ended while the daemon was down")
    reason = f"{GONE} ({status.describe()})" if shut_down else GONE
    ended = ctx.clock()
    ctx.store(
        lambda s: s.update_attempt(
            run_id, number, state="ended", ended_at=ended, classification="interrupted", reason=reason
        )
    )
    return None


def _asked_to_end(status: ExitStatus) -> bool:
    """Terminated by a request to end (SIGTERM, SIGHUP, SIGINT) while no daemon watched: what a
    shutdown or a closed session does to every process, the daemon's included. Such a run was
    interrupted, so `on_interrupt` decides, not the restart policy meant for crashes."""
    asked = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    return status.signal in asked or status.code == EXIT_TERMINATED


def _nodes(run: Mapping[str, Any]) -> int:
    """The machines the run's attempts span (its spec's resources.nodes)."""
    resources = dict(run["spec"]).get("resources")
    nodes = resources.get("nodes") if isinstance(resources, dict) else None
    return nodes if isinstance(nodes, int) and nodes > 0 else 1


def _step_watch(run: Mapping[str, Any], world: int) -> StepWatch | None:
    """A fresh hang watchdog for a re-adopted gang (it times steps again from here)."""
    if world <= 1:
        return None
    try:
        return step_watch(spec_from_mapping(dict(run["spec"])), world)
    except UserError:
        return None


def _recall(ctx: Context, active: Active) -> None:
    """What the previous daemon knew from the attempt's stored events: its last decisive event,
    and for a gang the ranks' pids, their step times (silence counts from now: a gang that hung
    while no daemon watched is caught one bound after its adoption) and the first rank that
    failed on its own."""
    if not active.gang:
        last = ctx.store(lambda s: s.last_event(active.run_id, active.attempt, DECISIVE_EVENTS))
        active.decisive_event = last["type"] if last else None
        return
    types = ("started", "progress", *DECISIVE_EVENTS)
    stored = ctx.store(lambda s: s.events(active.run_id, limit=100_000, types=types))
    now = ctx.clock()
    for event in stored:
        if event["attempt"] == active.attempt and event["source"] == "runner":
            remember(active, event, int(event.get("rank") or 0), now)


def _unrecorded(ctx: Context, run_id: str, number: int, found: Sequence[Tagged]) -> tuple[int, float]:
    """(pid, create time) of an attempt the daemon spawned but died before recording, or (0, 0).

    Every rank of a gang leads a session of its own and carries the attempt's tag too; the
    exit-status recorder, which started torchrun, is the one created first."""
    leaders = [t for t in found if t.run_id == run_id and t.attempt == number and t.leader]
    if not leaders:
        return 0, 0.0
    first = min(leaders, key=lambda t: t.create_time)
    pid, create_time = first.pid, first.create_time
    ctx.store(lambda s: s.update_attempt(run_id, number, pid=pid, create_time=create_time))
    log.info("run %s: attempt %d found by its tag (pid %d)", run_id, number, pid)
    return pid, create_time


def _watch_again(ctx: Context, run: Mapping[str, Any], active: Active) -> None:
    run_id, pid = str(run["id"]), active.child.pid
    ctx.active[run_id] = active
    if active.stop_requested:
        _stop_again(ctx, active)
    ctx.store(lambda s: s.update_attempt(run_id, active.attempt, adopted=1, state="running"))
    ctx.event(run_id, active.attempt, "adopted", pid=pid)
    if run["state"] != RunState.RUNNING:
        ctx.set_state(run_id, RunState.RUNNING, f"re-adopted pid {pid} after a daemon restart")
    log.info("run %s: re-adopted pid %s", run_id, pid)
    pump(ctx, active)


def _stop_again(ctx: Context, active: Active) -> None:
    """A run being stopped when the daemon went down is still being stopped: its SIGKILL comes
    when the recorded grace period ends (at once when it ended while no daemon watched)."""
    stops = ctx.store(lambda s: s.events(active.run_id, limit=100_000, types=("stopping",)))
    recorded = [e for e in stops if e["attempt"] == active.attempt and e.get("kill_at") is not None]
    if recorded:
        active.kill_at = float(recorded[-1]["kill_at"])
        return
    # Asked to stop, but the daemon went down before it signalled: signal now.
    active.kill_at = ctx.clock() + ctx.settings.stop_grace_seconds
    if not active.child.signal_group(signal.SIGTERM):
        active.kill_at = None


def _kill_leftovers(ctx: Context, found: Sequence[Tagged]) -> None:
    """Kill what carries the tag of one of this daemon's runs that has no attempt running (what
    a watched attempt started is its own business until it ends), and the standbys a previous
    daemon started for the attempt after a running one (the tag of a later attempt)."""
    known = {t.run_id for t in found if t.run_id not in ctx.active and ctx.find(t.run_id) is not None}
    leftovers = [t for t in found if t.run_id in known or _standby(ctx, t)]
    if leftovers:
        log.info("killing %d leftover process(es) of runs %s", len(leftovers), sorted(known))
        ctx.backends.processes.kill(leftovers)


def _standby(ctx: Context, tagged: Tagged) -> bool:
    """Whether `tagged` carries the tag of an attempt after the one its run is running."""
    active = ctx.active.get(tagged.run_id)
    return active is not None and tagged.attempt is not None and tagged.attempt > active.attempt


def _retuning(ctx: Context, run: Mapping[str, Any]) -> Unfinished | None:
    """A run caught retuning: queued when its decision was recorded, else decided again."""
    run_id, number = str(run["id"]), int(run["attempt"])
    shutil.rmtree(Path(run["run_dir"]) / "probes" / f"after-{number}", ignore_errors=True)
    if any(r["attempt"] == number for r in ctx.store(lambda s: s.retunes(run_id))):
        ctx.set_state(run_id, RunState.QUEUED, "retuned before a daemon restart; waiting to start")
        return None
    attempt = ctx.store(lambda s: s.attempt(run_id, number))
    if attempt is None:
        interrupted(ctx, run)
        return None
    return Unfinished(run_id, attempt)


def _restore_backoffs(ctx: Context) -> None:
    """Queued runs waiting out a restart backoff keep waiting after a daemon restart."""
    now = ctx.clock()
    for run in ctx.store(lambda s: s.list_runs(states=(RunState.QUEUED,))):
        at = _restart_at(ctx, str(run["id"]))
        if at is not None and at > now:
            ctx.not_before[run["id"]] = at


def _restart_at(ctx: Context, run_id: str) -> float | None:
    """When the run's latest scheduled restart was due (None: it was never restarted)."""
    restarts = ctx.store(lambda s: s.events(run_id, limit=100_000, types=("restart",)))
    return float(restarts[-1]["at"]) if restarts and restarts[-1].get("at") is not None else None


def interrupted(ctx: Context, run: Mapping[str, Any]) -> None:
    run_id = str(run["id"])
    if run["stop_requested"]:
        ctx.set_state(run_id, RunState.STOPPED, f"stop was requested; {GONE}")
    elif run["spec"].get("on_interrupt") == "resume":
        ctx.set_state(run_id, RunState.INTERRUPTED, f"{GONE}; resuming")
        ctx.set_state(run_id, RunState.QUEUED, "resuming after an interruption (on_interrupt: resume)")
    else:
        ctx.set_state(run_id, RunState.INTERRUPTED, f"{GONE} — `gpuwarden resume` it")
