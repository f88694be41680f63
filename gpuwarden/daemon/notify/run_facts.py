"""What a message says of its run, read on the notifications thread through its own read-only
connection (never the writer's: a message is written while the supervisor goes on)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.api.runs import Retune
from gpuwarden.core.logtail import read_log
from gpuwarden.core.notify.rules import RunFacts
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore

TAIL_LINES = 10
TAIL_BYTES = 4096


class StoreFacts:
    """`facts(run_id)` for the notifications thread (one connection, opened on first use)."""

    def __init__(self, db_path: Path) -> None:
        self._path = db_path
        self._db: sqlite_utils.Database | None = None

    def __call__(self, run_id: str) -> RunFacts | None:
        if self._db is None:
            self._db = open_db(self._path, readonly=True)
        store = RunStore(self._db)
        run = store.get_run(run_id)
        if run is None:
            return None
        attempts = store.attempts(run_id)
        tail, name = log_tail(attempts[-1]) if attempts else ("", "stderr")
        retunes = store.retunes(run_id)
        retune = Retune.model_validate(retunes[-1]) if retunes else None
        return RunFacts(str(run["id"]), str(run["name"]), run.get("message"), tail, name, retune)


def log_tail(attempt: dict[str, object]) -> tuple[str, str]:
    """The last lines of the attempt's stderr, else of its stdout (a script that prints its
    traceback to stdout), and which one it is."""
    for name in ("stderr", "stdout"):
        path = attempt.get(f"{name}_path")
        if not path:
            continue
        text = read_log(Path(str(path)), None, TAIL_BYTES).data
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            return "\n".join(lines[-TAIL_LINES:]), name
    return "", "stderr"
