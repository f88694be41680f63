"""How each rank of an ended gang attempt finished, and which rank failed first (the cause).

Read after torchrun has exited, from three sources, best first:
- each rank's events file: its last `oom`/`error` event says what it hit (a rank stopped because
  another failed writes `error` with code `gang_aborted`: it is a consequence, not the cause);
- each failed rank's error file (written by gpuwarden's runner): its exit status;
- torchrun's failure summary on its stderr: the exit status (or signal) of every failed rank,
  including ranks that could write nothing (SIGKILL, the kernel's OOM killer) and users' scripts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.events import EXIT_GANG_ABORTED, EXIT_OK, EXIT_TERMINATED, decode
from gpuwarden.core.gang.files import RankLogs, rank_events_path, rank_logs

DECISIVE = ("started", "progress", "checkpoint", "oom", "error", "finished")
EVENTS_TAIL_BYTES = 1 << 20
# One entry of torchrun's ChildFailedError summary ("rank : 1 (local_rank: 1)" then "exitcode : 3 (pid: 42)").
_FAILURE_RE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)"
)
_ROOT_CAUSE_RE = re.compile(
    r"Root Cause \(first observed failure\):\s*\n\[\d+\]:(?P<body>.*?)(?:\n=+|\Z)", re.S
)


@dataclass(frozen=True)
class RankOutcome:
    """One rank at the end of an attempt."""

    rank: int
    events_path: Path
    last_event: str | None  # type of its last decisive event; None if it wrote none
    exit_code: int | None  # negative = killed by that signal; None = not known (or not failed)
    failure: dict[str, Any] | None  # its last `oom`/`error` event
    message: str = ""

    @property
    def caused(self) -> bool:
        """Whether this rank failed on its own (not because another rank had failed)."""
        if self.failure is not None:
            return self.failure.get("type") == "oom" or self.failure.get("code") != "gang_aborted"
        return self.exit_code not in (None, EXIT_OK, EXIT_TERMINATED, EXIT_GANG_ABORTED)


@dataclass(frozen=True)
class GangOutcome:
    """Every rank's outcome, and the rank whose failure came first (None when none failed)."""

    ranks: list[RankOutcome]
    first_failure: RankOutcome | None


@dataclass(frozen=True)
class TorchrunFailures:
    """What torchrun's failure summary says: exit status per failed rank, and the root cause."""

    exit_codes: dict[int, int]
    root_cause: int | None


def parse_torchrun_failures(stderr: str) -> TorchrunFailures:
    """The failed ranks in torchrun's ChildFailedError summary (empty when it printed none)."""
    codes = {int(m["rank"]): int(m["code"]) for m in _FAILURE_RE.finditer(stderr)}
    root = None
    found = _ROOT_CAUSE_RE.search(stderr)
    if found:
        first = _FAILURE_RE.search(found["body"])
        root = int(first["rank"]) if first else None
    return TorchrunFailures(codes, root)


def _tail_events(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - EVENTS_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > EVENTS_TAIL_BYTES:
        lines = lines[1:]  # the first line may be cut
    return [e for e in (decode(line) for line in lines) if e is not None]


def _error_file_code(path: Path) -> int | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    code = record.get("exitcode") if isinstance(record, dict) else None
    return code if isinstance(code, int) else None


def read_rank(
    attempt_dir: Path, rank: int, torchrun: TorchrunFailures, logs: RankLogs | None = None
) -> RankOutcome:
    """The outcome of one rank from its events, its error file and torchrun's summary."""
    events_path = rank_events_path(attempt_dir / "events.jsonl", rank)
    events = [e for e in _tail_events(events_path) if e.get("type") in DECISIVE]
    last = events[-1] if events else None
    failure = next((e for e in reversed(events) if e["type"] in ("oom", "error")), None)
    code = _error_file_code(logs.error_file) if logs is not None else None
    if code is None:
        code = torchrun.exit_codes.get(rank)
    message = str(failure.get("message", "")) if failure else ""
    if failure and failure["type"] == "oom":
        message = f"out of memory ({failure.get('verdict')}): {message}"
    return RankOutcome(rank, events_path, last["type"] if last else None, code, failure, message)


def read_gang_outcome(
    attempt_dir: Path, world_size: int, torchrun_stderr: str, nodes: int = 1
) -> GangOutcome:
    """Every rank's outcome; the first failure is the earliest failure event of a rank that
    failed on its own, else torchrun's root cause (a rank that could not write an event).
    `torchrun_stderr` holds every machine's torchrun output for a run over `nodes` machines."""
    torchrun = parse_torchrun_failures(torchrun_stderr)
    logs = rank_logs(attempt_dir, nodes, world_size // nodes)
    ranks = [read_rank(attempt_dir, rank, torchrun, logs.get(rank)) for rank in range(world_size)]
    causes = [r for r in ranks if r.caused]
    with_events = sorted(
        (r for r in causes if r.failure), key=lambda r: float(r.failure["ts"]) if r.failure else 0.0
    )
    if with_events:
        return GangOutcome(ranks, with_events[0])
    by_rank = {r.rank: r for r in causes}
    first = by_rank.get(torchrun.root_cause) if torchrun.root_cause is not None else None
    return GangOutcome(ranks, first or (causes[0] if causes else None))
