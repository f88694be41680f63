"""Samples (or items) each attempt of a run did, counted once across resumes.

Progress events carry a cumulative `samples_seen`: an attempt that resumed from a checkpoint
counts on from that checkpoint's count. What an attempt did is its last count over the count it
started from, its base. The report (from a run's events) and the store (the run detail's energy,
from aggregates) both answer through `samples_done`, so the figures agree wherever they are read.
"""

from __future__ import annotations

import os
from typing import Any

# attempt → samples_seen of its first and last progress event (min and max: counts only grow)
Counts = dict[int, tuple[int, int]]


def _count(event: dict[str, Any]) -> int | None:
    value = event.get("samples_seen")
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def progress_counts(events: list[dict[str, Any]]) -> Counts:
    """First and last count of each attempt that reported progress (0 where none was numeric)."""
    seen: dict[int, list[int]] = {}
    for e in _of(events, "progress", "runner"):
        attempt = e.get("attempt")
        if isinstance(attempt, int):
            counts = seen.setdefault(attempt, [])
            value = _count(e)
            if value is not None:
                counts.append(value)
    return {a: (min(v), max(v)) if v else (0, 0) for a, v in seen.items()}


def samples_done(counts: Counts, events: list[dict[str, Any]]) -> dict[int, int]:
    """Samples each attempt in `counts` did. `events`: the run's events; only the runners'
    `started` and `checkpoint` and the daemon's `prepared` are read."""
    return {a: max(0, last - _base(a, first, counts, events)) for a, (first, last) in counts.items()}


def _of(events: list[dict[str, Any]], type_: str, source: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == type_ and e.get("source", "runner") == source]


def _base(attempt: int, first: int, counts: Counts, events: list[dict[str, Any]]) -> int:
    """The count attempt `attempt` started from, best source first. Past the runner's own word,
    a base never exceeds the attempt's first count, so the result is never negative; and it is
    never below where the attempt can have started counting, so no sample counts twice."""
    started = [e for e in _of(events, "started", "runner") if e.get("attempt") == attempt]
    if started:
        return _said_base(started[-1], attempt, first, counts, events)
    prepared = [e for e in _of(events, "prepared", "daemon") if e.get("attempt") == attempt]
    if prepared and "resume_from" in prepared[-1]:
        path = prepared[-1]["resume_from"]
        if path is None:
            return 0  # the daemon handed it no checkpoint: it counts from scratch
        saved = _checkpoint_count(events, attempt, str(path))
        if saved is not None:
            return min(saved, first)
    # Resume point unknown (a run recorded before the daemon noted it, or a checkpoint found by
    # glob without an event). An attempt that counts on from where earlier ones got started at
    # most there; one whose first count is lower started counting afresh somewhere at or below
    # it, so only what it did from its first report on is sure to be its own.
    return min(_reported_before(counts, events, attempt), first)


def _said_base(
    started: dict[str, Any], attempt: int, first: int, counts: Counts, events: list[dict[str, Any]]
) -> int:
    """The base by the program's own `started` event: the count it says, else the count of the
    checkpoint it says it resumed from (the SDK's resume_from() names only that), else 0."""
    said = _count(started)
    if said is not None:
        return said
    loaded = started.get("resumed_from")
    if not loaded:
        return 0
    saved = _checkpoint_count(events, attempt, str(loaded))
    return min(saved if saved is not None else _reported_before(counts, events, attempt), first)


def _checkpoint_count(events: list[dict[str, Any]], attempt: int, path: str) -> int | None:
    """samples_seen of the checkpoint at `path` an earlier attempt reported, if any did."""
    wanted = os.path.normpath(path)
    found = [
        _count(e)
        for e in _of(events, "checkpoint", "runner")
        if int(e.get("attempt") or 0) < attempt
        and isinstance(e.get("path"), str)
        and os.path.normpath(e["path"]) == wanted
    ]
    known = [c for c in found if c is not None]
    return known[-1] if known else None


def _reported_before(counts: Counts, events: list[dict[str, Any]], attempt: int) -> int:
    """The highest count earlier attempts reported, in progress or with a checkpoint."""
    progress = [last for a, (_, last) in counts.items() if a < attempt]
    saved = [
        c
        for e in _of(events, "checkpoint", "runner")
        if int(e.get("attempt") or 0) < attempt
        for c in [_count(e)]
        if c is not None
    ]
    return max([*progress, *saved], default=0)
