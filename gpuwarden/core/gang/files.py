"""Where the ranks of a multi-process attempt write, shared by the runner and the daemon.

- Events: rank 0 writes the run's events to the attempt's `events.jsonl` (the file a one-process
  run writes); rank N > 0 writes its own `events.rank<N>.jsonl` beside it. One writer per file:
  a rank killed in the middle of a line leaves a partial last line only in its own file, and the
  daemon tails each file from its own offset exactly as it tails a one-process run.
- torchrun's per-rank files (`--log-dir`): `ranks/<rendezvous id>_<random>/attempt_0/<rank>/`
  holds `stdout.log`, `stderr.log` and `error.json` (the rank's failure, written by the runner;
  `TORCHELASTIC_ERROR_FILE` points there inside the rank).
- torchrun's own failure summary: `torchrun-error.json` in the attempt directory (torchrun copies
  the first failed rank's `error.json` there).
- A run over several machines: each machine's torchrun keeps its ranks' files under a folder of
  its own (`ranks/` on the first, `ranks-node<K>/` on machine K, whose local rank L is rank
  K × ranks per machine + L) and its failure summary in `torchrun-error.node<K>.json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RANK_LOGS_DIR = "ranks"
TORCHRUN_ERROR_FILE = "torchrun-error.json"
_RANK_EVENTS_RE = re.compile(r"\.rank(\d+)$")


def node_log_dir(attempt_dir: Path, node_rank: int) -> Path:
    """torchrun's --log-dir on machine `node_rank` of the run (`ranks/` on the first)."""
    return attempt_dir / (RANK_LOGS_DIR if node_rank == 0 else f"{RANK_LOGS_DIR}-node{node_rank}")


def node_error_file(attempt_dir: Path, node_rank: int) -> Path:
    """Where machine `node_rank`'s torchrun writes its failure summary."""
    if node_rank == 0:
        return attempt_dir / TORCHRUN_ERROR_FILE
    return attempt_dir / TORCHRUN_ERROR_FILE.replace(".json", f".node{node_rank}.json")


def rank_events_path(events_path: Path, rank: int) -> Path:
    """The events file of `rank`: `events_path` itself for rank 0, `<stem>.rank<N><suffix>` else."""
    if rank == 0:
        return events_path
    return events_path.with_name(f"{events_path.stem}.rank{rank}{events_path.suffix}")


def rank_event_files(events_path: Path) -> dict[int, Path]:
    """Every rank's events file that exists next to `events_path` (rank 0's = `events_path`)."""
    found = {0: events_path} if events_path.is_file() else {}
    for path in events_path.parent.glob(f"{events_path.stem}.rank*{events_path.suffix}"):
        match = _RANK_EVENTS_RE.search(path.name[: len(path.name) - len(events_path.suffix)])
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class RankLogs:
    """torchrun's files for one rank (any of them may be missing: a rank that never started)."""

    rank: int
    stdout: Path
    stderr: Path
    error_file: Path


def rank_logs(attempt_dir: Path, nodes: int = 1, per_node: int = 0) -> dict[int, RankLogs]:
    """The per-rank log folders each machine's torchrun made (`node_log_dir`): on machine K of
    `nodes`, local rank L is rank K × `per_node` + L. Empty before torchrun started its workers."""
    found: dict[int, RankLogs] = {}
    for node in range(nodes):
        for folder in sorted(node_log_dir(attempt_dir, node).glob("*/attempt_*/*")):
            if folder.is_dir() and folder.name.isdigit():
                rank = node * per_node + int(folder.name)
                logs = RankLogs(rank, folder / "stdout.log", folder / "stderr.log", folder / "error.json")
                found[rank] = logs
    return found
