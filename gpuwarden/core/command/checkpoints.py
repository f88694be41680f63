"""`{resume_from}`: the newest complete checkpoint a user's program wrote during this run.

Two sources, both read from disk (no daemon needed): `checkpoint` events the program reported
in earlier attempts' events.jsonl (the SDK and the framework callbacks write them), and the
spec's `checkpoints.glob`. A folder counts only once its `complete_when` file exists, so a
checkpoint cut short by the out-of-memory is never resumed from. Only checkpoints written since
the run's first attempt started count: an output folder left by an earlier run is not this run's.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.command.record import attempt_dir
from gpuwarden.core.events import decode

_STEP_RE = re.compile(r"step[=_-]?(\d+)", re.I)
_NUMBER_RE = re.compile(r"(\d+)")
# File systems round modification times; a checkpoint written in the first attempt's first
# second must not look older than the attempt.
MTIME_SLACK_S = 2.0


@dataclass(frozen=True)
class FoundCheckpoint:
    path: Path
    step: int | None
    source: str  # "event" or "glob"
    mtime: float

    def order(self) -> tuple[float, int]:
        """The one written last comes first; the step in its name only breaks a tie. A run's
        progress moves forward in time, not always in the names: Lightning's `last.ckpt` (no step)
        is newer than the best-so-far `epoch=2-step=30.ckpt` a monitored callback keeps, and an
        attempt that resumed from an older checkpoint writes the line the run now follows."""
        return (self.mtime, self.step if self.step is not None else -1)


def step_in_name(name: str) -> int | None:
    """`checkpoint-12` → 12, `epoch=0-step=30.ckpt` → 30, `last.ckpt` → None."""
    match = _STEP_RE.search(name)
    if match:
        return int(match.group(1))
    numbers = _NUMBER_RE.findall(name)
    return int(numbers[-1]) if numbers else None


def is_complete(found: FoundCheckpoint, complete_when: str | None) -> bool:
    """A folder with its `complete_when` file. Where the spec names one, its checkpoints are
    folders: a file the pattern also matches (`step_10.log` beside `step_*` folders) is not one;
    a file the program itself reported is."""
    path = found.path
    if not path.exists():
        return False
    if path.is_dir() and complete_when:
        return (path / complete_when).exists()
    return not (complete_when and found.source == "glob")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _checkpoint_lines(events: Path) -> Iterator[str]:
    """The lines of an attempt's events that can be checkpoint events, read a line at a time: a
    long run's file holds millions of progress events, and only its checkpoints matter here."""
    try:
        with events.open(encoding="utf-8", errors="replace") as lines:
            yield from (line for line in lines if '"checkpoint"' in line)
    except OSError:
        return


def _reported(run_dir: Path, before: int, cwd: Path) -> Iterator[FoundCheckpoint]:
    for number in range(1, before):
        lines = _checkpoint_lines(attempt_dir(run_dir, number) / "events.jsonl")
        for event in (decode(line) for line in lines):
            if event is None or event.get("type") != "checkpoint" or not isinstance(event.get("path"), str):
                continue
            path = Path(event["path"]).expanduser()
            path = path if path.is_absolute() else cwd / path
            step = event.get("step")
            yield FoundCheckpoint(
                path,
                step if isinstance(step, int) and not isinstance(step, bool) else None,
                "event",
                _mtime(path),
            )


def _globbed(pattern: str, cwd: Path) -> Iterator[FoundCheckpoint]:
    absolute = os.path.isabs(os.path.expanduser(pattern))
    for match in glob.glob(os.path.expanduser(pattern), root_dir=None if absolute else cwd, recursive=True):
        path = Path(match) if absolute else cwd / match
        yield FoundCheckpoint(path, step_in_name(path.name), "glob", _mtime(path))


def newest_checkpoint(
    run_dir: Path,
    attempt: int,
    cwd: Path,
    pattern: str | None,
    complete_when: str | None,
    since: float | None,
) -> FoundCheckpoint | None:
    """The newest complete checkpoint from attempts before `attempt`, or None (first attempt,
    or nothing complete yet). `since` is when the run's first attempt started."""
    if attempt <= 1:
        return None
    found = list(_reported(run_dir, attempt, cwd))
    if pattern:
        found += _globbed(pattern, cwd)
    earliest = None if since is None else since - MTIME_SLACK_S
    usable = [
        c
        for c in found
        if is_complete(c, complete_when) and (c.source == "event" or earliest is None or c.mtime >= earliest)
    ]
    return max(usable, key=FoundCheckpoint.order, default=None)
