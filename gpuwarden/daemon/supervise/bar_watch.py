"""The progress bar of a program that reports no progress of its own, recorded as it moves.

A user's script run as it is written says nothing to gpuwarden about its progress, but its log
holds the bar it draws (`core/progress_bar.py`). While an attempt runs, the loop reads what its
two logs gained every few seconds (only when they grew, at most the last 16 KB of it), follows
the run's bar through them and records it as a `progress_bar` event when it moved enough
(`core/bar_follow.py`): what the dashboard's Progress and ETA, `show` and `events` read. Once the
program reports progress itself (the SDK, the Trainer's or Lightning's callback), that is the
truth and the bar is no longer read.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwarden.core.progress_bar import bar_payload, bar_readings
from gpuwarden.daemon.supervise.context import Active, Context

log = logging.getLogger("gpuwarden.daemon.supervisor")

LOOK_EVERY_S = 2.0
TAIL_BYTES = 16 * 1024  # what more a log gained is output, not a drawing the run is at


def watch_bar(ctx: Context, active: Active, now: float, ended: bool = False) -> None:
    """Read what the attempt's logs gained; record the run's bar if it moved enough (`ended`: the
    program has exited, so this is its last look, whenever the one before was)."""
    watch = active.bar
    if watch.own_progress or (now < watch.next_look and not ended):
        return
    watch.next_look = now + LOOK_EVERY_S
    try:
        for path in (active.stderr_path, active.attempt_dir / "stdout.log"):
            text, watch.offsets[path.name] = log_gained(path, watch.offsets.get(path.name, 0))
            watch.see(bar_readings(text), now)
    except Exception:  # the bar is advice: a bug reading it must not fail the run it describes
        log.exception("run %s: its progress bar could not be read; not read again", active.run_id)
        watch.own_progress = True
        return
    reading = watch.due(now, ended)
    if reading is not None:
        ctx.event(active.run_id, active.attempt, "progress_bar", **bar_payload(reading))


def log_gained(path: Path, offset: int) -> tuple[str, int]:
    """What `path` gained since `offset`, and the offset after it. A bar's drawing starts with a
    carriage return and ends with `]`, with no line break after it: a last line that does not
    end so may be a drawing half written, and is read whole next time."""
    try:
        size = path.stat().st_size
        if size <= offset:
            return "", min(offset, size)  # nothing new, or the log was cut short
        start = max(offset, size - TAIL_BYTES)
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return "", offset
    line_start = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    end = len(data)
    if not data[line_start:].rstrip(b" ").endswith(b"]"):
        # One line longer than any drawing is no bar: read, and never read again.
        end = line_start if line_start or len(data) < TAIL_BYTES else len(data)
    return data[:end].decode("utf-8", "replace"), start + end
