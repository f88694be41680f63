"""What an ended attempt means: store everything it wrote, give the verdict, record it.

The finisher says where the run goes next (`Ending`); the loop acts on it (a final state, a
retune, a restart), so nothing here starts another attempt. A gang's verdict comes from the rank
that failed first on its own (`daemon/gang_verdict.py`), and that rank's exit status and stderr
are the evidence a retune or a restart policy goes by.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwarden.core.command.resume import INEXACT_CODE, inexact_resume
from gpuwarden.core.events import LEFT_RUNNING_CODE
from gpuwarden.core.gang.files import rank_logs
from gpuwarden.core.gang.nodes import node_output
from gpuwarden.core.gang.outcome import read_gang_outcome
from gpuwarden.core.oom.classify import classify_text, oom_kill_grew
from gpuwarden.core.terminal_text import plain_text
from gpuwarden.core.units import size
from gpuwarden.daemon.gang_verdict import RankEvidence, gang_verdict
from gpuwarden.daemon.process import ExitStatus, ExitVerdict, Outcome, classify, or_recorded
from gpuwarden.daemon.supervise.context import DECISIVE_EVENTS, Active, Context, Ending
from gpuwarden.daemon.supervise.gang_stop import kill_now
from gpuwarden.daemon.supervise.hooks import AttemptEnd
from gpuwarden.daemon.supervise.pump import pump

log = logging.getLogger("gpuwarden.daemon.supervisor")

STDERR_TAIL_BYTES = 65536
ESCAPED_SHOWN = 3


def finish(
    ctx: Context, active: Active, status: ExitStatus, *, note: str | None = None, kill_group: bool = True
) -> Ending:
    """An attempt's process ended: store what it wrote, classify, record the attempt. A write the
    store refuses leaves the attempt watched, to finish again at the next pass.

    `kill_group` is False for a process that ended while no daemon watched: its pid may have
    been reused since, so its process group is no longer known to be the run's.
    """
    status = or_recorded(status, active.exit_file)  # a re-adopted attempt's recorded status
    left_running = _last_events(ctx, active, kill_group)
    oom_kill = oom_kill_grew(active.oom_before, ctx.backends.oom_kills())
    stderr_tail = tail_of(active.stderr_path)
    if active.gang:
        verdict, evidence = _gang(active, status, oom_kill, stderr_tail, _memory_limit(ctx, active.run_id))
    else:
        verdict = _verdict(ctx, active, status, oom_kill, stderr_tail)
        evidence = RankEvidence(None, status, stderr_tail)
    reason = f"{verdict.reason}; {note}" if note else verdict.reason
    ended = (active.exited_at or ctx.clock()) if kill_group else ended_unwatched(active, ctx.clock())
    _record_end(ctx, active, status, verdict, reason, ended, left_running)
    # Watched until its end is recorded: a store that refused it has it again at the next pass.
    ctx.active.pop(active.run_id, None)
    log.info("run %s attempt %d: %s", active.run_id, active.attempt, reason)
    end = AttemptEnd(
        number=active.attempt,
        outcome=verdict.outcome,
        reason=reason,
        exit_code=evidence.status.code,
        signal=evidence.status.signal,
        oom_kill=oom_kill,
        stderr_tail=evidence.stderr_tail,
        gpus=list(active.gpus),
        gpu_capacity=gpu_capacity(ctx, active.gpus),
        host_capacity=host_capacity(ctx, active.run_id),
        adopted=active.child.adopted,
        pid=active.child.pid or None,
        rank=evidence.rank,
        world_size=active.world_size,
        rank_pids=tuple(active.rank_pids.values()),
    )
    message = f"attempt {active.attempt}: {reason}"
    # A gang's restart policy goes by the failed rank's exit status (torchrun always exits 1).
    decisive = status if evidence.rank is None else evidence.status
    return Ending(
        active.run_id, active.attempt, verdict, decisive, message, end, active.decisive_event, ended_at=ended
    )


def _record_end(
    ctx: Context,
    active: Active,
    status: ExitStatus,
    verdict: ExitVerdict,
    reason: str,
    ended: float,
    left_running: str | None,
) -> None:
    """The attempt's end, its retune's outcome, what its log says of its resume and what it left
    running, at once."""
    record = (
        ctx.batch()
        .write(
            lambda s: s.update_attempt(
                active.run_id,
                active.attempt,
                state="ended",
                ended_at=ended,
                exit_code=status.code,
                signal=status.signal,
                classification=verdict.outcome,
                reason=reason,
            )
        )
        .write(lambda s: s.set_retune_outcome(active.run_id, verdict.outcome))
    )
    if (inexact := _inexact_resume(ctx, active)) is not None:
        record.event(active.run_id, active.attempt, "warning", code=INEXACT_CODE, message=inexact)
    if left_running is not None:
        record.event(active.run_id, active.attempt, "warning", code=LEFT_RUNNING_CODE, message=left_running)
    record.commit()


def _inexact_resume(ctx: Context, active: Active) -> str | None:
    """Whether a command's attempt resumed inexactly, by its framework's own word on stderr (rank
    0's, in a gang). Read once the attempt has ended, not as its log grows: the framework says it
    once, while restoring, and the log's head keeps it for good, so reading it here is as sure
    as tailing the log and needs no offset carried across daemon restarts; and in the same
    transaction as the attempt's end, it is stored once, even when that write is taken again."""
    if ctx.run(active.run_id)["kind"] != "command":
        return None
    logs = [active.stderr_path]
    if active.gang and (rank0 := rank_logs(active.attempt_dir, active.nodes).get(0)) is not None:
        logs.append(rank0.stderr)
    return inexact_resume(logs)


def _last_events(ctx: Context, active: Active, kill_group: bool) -> str | None:
    """Store what the attempt wrote last; kill what it left behind, once, even when the store
    refuses the events (the run is over: nothing it started may outlive it). Returns what was
    killed outside the attempt's process group, to be said."""
    try:
        pump(ctx, active, final=True)
    finally:
        alive = kill_group and not active.group_killed and active.child.pid
        if alive and (active.gang or active.child.group_alive()):  # a gang's ranks lead groups of their own
            kill_now(active)
        escaped = _escaped(ctx, active) if kill_group and not active.group_killed else None
        active.group_killed = True
    return escaped


def _escaped(ctx: Context, active: Active) -> str | None:
    """Kill what the attempt started outside its process group (a helper started with `setsid`,
    a daemonized server) that still carries its tag; say what, since a program may have meant
    it to stay. A gang's ranks lead groups of their own and are killed as a tree already."""
    if active.gang or not active.child.pid:
        return None
    left = [
        t
        for t in ctx.backends.processes.tagged()
        if t.run_id == active.run_id and t.attempt == active.attempt and t.group != active.child.pid
    ]
    if not left:
        return None
    ctx.backends.processes.kill(left)
    shown = ", ".join(f"{t.pid} {t.name}".rstrip() for t in left[:ESCAPED_SHOWN])
    more = f" and {len(left) - ESCAPED_SHOWN} more" if len(left) > ESCAPED_SHOWN else ""
    log.info("run %s attempt %d: killed %d left running", active.run_id, active.attempt, len(left))
    return (
        f"attempt {active.attempt} left {len(left)} process(es) running outside its process group "
        f"(pid {shown}{more}): killed, as nothing a run starts outlives it — a server the program "
        "needs afterwards belongs in a run or a service of its own"
    )


def ended_unwatched(active: Active, now: float) -> float:
    """When an attempt that ended while no daemon watched ended: its recorded exit status was
    written then; else its last write to its events or stderr (never later than `now`)."""
    for paths in ((active.exit_file,), (active.tail.path, active.stderr_path)):
        times = []
        for path in paths:
            with contextlib.suppress(OSError):
                times.append(path.stat().st_mtime)
        if times:
            return min(max(times), now)
    return now


def _gang(
    active: Active, status: ExitStatus, oom_kill: bool | None, torchrun_stderr: str, memory_limit: int | None
) -> tuple[ExitVerdict, RankEvidence]:
    # Every machine's torchrun says which of its ranks failed: a rank that wrote no event is found
    # only there.
    everywhere = torchrun_stderr + "".join(
        tail_of(node_output(active.attempt_dir, node)[1]) for node in range(1, active.nodes)
    )
    outcome = read_gang_outcome(active.attempt_dir, active.world_size, everywhere, active.nodes)
    logs = rank_logs(active.attempt_dir, active.nodes, active.world_size // active.nodes)
    stop = active.gang_stop
    return gang_verdict(
        status,
        outcome,
        stop_requested=active.stop_requested,
        hang_reason=stop.reason if stop is not None and stop.cause == "hang" else None,
        oom_kill=oom_kill,
        rank_stderr=lambda rank: tail_of(logs[rank].stderr) if rank in logs else "",
        torchrun_stderr=torchrun_stderr,
        rank0_event=active.decisive_event,
        memory_limit=memory_limit,
    )


def recorded_ending(ctx: Context, run_id: str, attempt: Mapping[str, Any]) -> Ending:
    """An attempt the previous daemon finished and recorded, but died before it moved the run on
    (retune, restart or final state): the same ending again, from the record."""
    end = recorded_end(ctx, run_id, attempt, outcome=attempt["classification"])
    verdict = ExitVerdict(outcome=attempt["classification"], reason=end.reason)
    last = ctx.store(lambda s: s.last_event(run_id, end.number, DECISIVE_EVENTS))
    return Ending(
        run_id,
        end.number,
        verdict,
        ExitStatus(code=end.exit_code, signal=end.signal),
        f"attempt {end.number}: {end.reason}",
        end,
        last["type"] if last else None,
        ended_at=float(attempt["ended_at"] or ctx.clock()),
    )


def recorded_end(
    ctx: Context, run_id: str, attempt: Mapping[str, Any], outcome: Outcome = "oom"
) -> AttemptEnd:
    """The facts of an attempt that ended (out of memory, by default), from its record: for a
    retune decided again after a daemon restart."""
    gpus = list(attempt["gpus"])
    return AttemptEnd(
        number=int(attempt["attempt"]),
        outcome=outcome,
        reason=str(attempt["reason"] or "out of memory"),
        exit_code=attempt["exit_code"],
        signal=attempt["signal"],
        # The counter only grows: growth since the attempt started still tells a kernel OOM kill.
        oom_kill=oom_kill_grew(attempt["oom_kill_before"], ctx.backends.oom_kills()),
        stderr_tail=tail_of(Path(attempt["stderr_path"])),
        gpus=gpus,
        gpu_capacity=gpu_capacity(ctx, gpus),
        host_capacity=host_capacity(ctx, run_id),
        adopted=bool(attempt["adopted"]),
        pid=attempt["pid"],
        world_size=int(attempt.get("world_size") or 1),
    )


def _verdict(
    ctx: Context, active: Active, status: ExitStatus, oom_kill: bool | None, stderr_tail: str
) -> ExitVerdict:
    command = ctx.run(active.run_id)["kind"] == "command"
    verdict = classify(
        status,
        stop_requested=active.stop_requested,
        oom_kills_delta=None if oom_kill is None else int(oom_kill),
        last_runner_event=active.decisive_event,
        runner_codes=not command,
    )
    if verdict.outcome == "failed" and status.known:
        # A program that is not our runner says it ran out of memory only on stderr.
        text = classify_text(
            stderr_tail,
            exit_code=status.code,
            signal=status.signal,
            oom_kill=oom_kill,
            memory_limit=_memory_limit(ctx, active.run_id),
        )
        if text.is_oom:
            return ExitVerdict("oom", f"{text.verdict}: {plain_text(text.reason)} ({status.describe()})")
        if text.verdict == "shape_bug":
            # Looks like an OOM, but no memory setting can satisfy it: fail, and say why.
            return ExitVerdict("failed", f"shape_bug: {plain_text(text.reason)} ({status.describe()})")
    if verdict.outcome == "failed" and active.decisive_event == "error":
        # The runner said why in its error event: that line, not only an exit code, is the reason.
        error = ctx.store(lambda s: s.last_event(active.run_id, active.attempt, ("error",)))
        if error and error.get("message"):
            return ExitVerdict("failed", f"{plain_text(str(error['message']))} ({status.describe()})")
    if verdict.outcome == "failed" and (small := _limit_too_small(ctx, active.run_id, status, stderr_tail)):
        return small
    if verdict.outcome == "failed" and command and status.known and (line := last_line(stderr_tail)):
        # A program's last word on stderr (a traceback's exception line) says more than its code.
        return ExitVerdict("failed", f"{status.describe()} — last stderr line: {line}{_caught(line)}")
    return verdict


# A script that catches the allocator's error and prints its own words: not evidence enough to
# retune (the words could mean anything), but the user should learn why nothing was retuned.
_OWN_OOM_WORDS = re.compile(r"out of memory|\bOOM\b", re.I)


def _caught(line: str) -> str:
    if not _OWN_OOM_WORDS.search(line):
        return ""
    return (
        " (not retuned: only the allocator's own out-of-memory error is evidence — let it reach "
        "stderr, or use gpuwarden.sdk's oom_guard)"
    )


# What the dynamic loader says when an address-space limit leaves no room to map a library (torch's
# are hundreds of megabytes): no micro-batch fixes that, only a larger limit.
LOADER_OUT_OF_ROOM = (
    "failed to map segment from shared object",
    "cannot allocate memory in static TLS block",
)


def _limit_too_small(ctx: Context, run_id: str, status: ExitStatus, stderr_tail: str) -> ExitVerdict | None:
    limit = _memory_limit(ctx, run_id)
    if not limit or not any(sign in stderr_tail for sign in LOADER_OUT_OF_ROOM):
        return None
    return ExitVerdict(
        "failed",
        f"resources.memory_limit ({size(limit)}) leaves no room to load the program's libraries — "
        f"raise it ({status.describe()})",
    )


# Lines a framework prints after the error itself, which say nothing about it: the error is the
# line before (Hydra ends every failed job with this one).
_TRAILERS = ("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",)


def last_line(text: str, width: int = 200) -> str:
    """The last non-blank line of `text` but a framework's trailer, as plain text, cut to `width`
    characters."""
    lines = [line for line in map(plain_text, text.splitlines()) if line]
    while len(lines) > 1 and lines[-1].strip() in _TRAILERS:
        lines.pop()
    if not lines:
        return ""
    return lines[-1] if len(lines[-1]) <= width else lines[-1][: width - 1] + "…"


def gpu_capacity(ctx: Context, gpus: Sequence[str]) -> int | None:
    """The smallest memory among `gpus`."""
    totals = [g.memory_total for g in ctx.backends.gpu_states() if g.uuid in gpus and g.memory_total]
    return min(totals) if totals else None


def _memory_limit(ctx: Context, run_id: str) -> int | None:
    """The run's address-space limit, if it has one."""
    limit = (ctx.run(run_id)["spec"].get("resources") or {}).get("memory_limit")
    return int(limit) if limit else None


def host_capacity(ctx: Context, run_id: str) -> int | None:
    """The run's address-space limit, else the host's memory."""
    return _memory_limit(ctx, run_id) or ctx.backends.host_memory()


def tail_of(path: Path, size: int = STDERR_TAIL_BYTES) -> str:
    """The last `size` bytes of a log as text ("" when unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
