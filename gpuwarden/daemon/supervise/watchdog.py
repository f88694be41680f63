"""The hang watchdog of gangs: a gang past its bound without progress (`core/gang/watchdog.py`)
has every rank's stacks dumped, is recorded as hung with the dump as evidence, and is stopped.

The dump goes whole to `attempts/<n>/hang-dump.txt`; the `hang` event carries the bound, the
silence, every rank's last step, the ranks found outside any collective (`suspects`) and the
start of each rank's dump. The finisher classifies the attempt `hang`; the run's restart policy
(`restart.on: [hang]`) decides whether it starts again from the last checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwarden.core.gang.files import rank_logs
from gpuwarden.core.gang.stacks import suspects
from gpuwarden.core.gang.watchdog import Silence
from gpuwarden.daemon.stack_dump import DumpTarget, StackDump
from gpuwarden.daemon.supervise.context import Active, Context, GangStop
from gpuwarden.daemon.supervise.gang_stop import stop_gang

log = logging.getLogger("gpuwarden.daemon.supervisor")

DUMP_FILE = "hang-dump.txt"
EXCERPT_CHARS = 4000  # of each rank's dump in the event; the file has all of it


def check(ctx: Context, active: Active, now: float) -> None:
    """Stop the gang as hung when it is past its bound (and not stopping already)."""
    if active.steps is None or active.gang_stop is not None or active.stop_requested:
        return
    silence = active.steps.overdue(now)
    if silence is None:
        return
    dumps = _dump(ctx, active)
    path = active.attempt_dir / DUMP_FILE
    _write(path, dumps)
    found = suspects({d.rank: d.text for d in dumps})
    reason = _reason(silence, found, path)
    log.warning("run %s attempt %d: %s", active.run_id, active.attempt, reason)
    hung = ctx.batch().event(
        active.run_id,
        active.attempt,
        "hang",
        quiet_s=round(silence.quiet_s, 3),
        bound_s=round(silence.bound_s, 3),
        median_step_s=silence.median_step_s,
        stride=silence.stride,
        last_steps={str(rank): step for rank, step in silence.last_steps.items()},
        suspects=found,
        dump=str(path),
        stacks={
            str(d.rank): {
                "pid": d.pid,
                "how": d.how,
                "text": (d.text or "")[:EXCERPT_CHARS] or None,
                "note": d.note,
            }
            for d in dumps
        },
    )
    ctx.owe(hung)  # the stacks are dumped once: a store that refuses the event has it later
    stop_gang(ctx, active, GangStop("hang", found[0] if len(found) == 1 else None, reason, now))


def _dump(ctx: Context, active: Active) -> list[StackDump]:
    """Every rank's stacks: the ranks torchrun runs now, else the pids their events gave."""
    pids = ctx.backends.processes.ranks(active.child.pid) or dict(active.rank_pids)
    logs = rank_logs(active.attempt_dir)
    targets = [
        DumpTarget(rank, pid, logs[rank].stderr if rank in logs else None)
        for rank, pid in sorted(pids.items())
    ]
    return ctx.backends.processes.dump_stacks(targets) if targets else []


def _write(path: Path, dumps: list[StackDump]) -> None:
    parts = []
    for d in dumps:
        body = d.text if d.text is not None else f"(no dump: {d.note})\n"
        parts.append(f"=== rank {d.rank} (pid {d.pid}, {d.how}) ===\n{body}")
    try:
        path.write_text("\n".join(parts) or "(no rank process found to dump)\n", encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write the hang dump %s: %s", path, exc)


def _reason(silence: Silence, found: list[int], path: Path) -> str:
    who = (
        f"rank {', '.join(map(str, found))} outside any collective, the others waiting for it"
        if found
        else "no rank stands out in the stacks"
    )
    stride = f" × {silence.stride} steps" if silence.stride > 1 else ""
    return (
        f"hang: no progress for {silence.quiet_s:.0f} s (bound {silence.bound_s:.0f} s = "
        f"{silence.factor:g} × median step {silence.median_step_s:.3g} s{stride}, at least "
        f"{silence.floor_s:g} s); {who}; stacks in {path}"
    )
