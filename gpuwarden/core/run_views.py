"""A run as the API shows it — its detail, attempts, a page of events, a slice of its log — built
from its store and its folder. The daemon's routes and the readers of run folders
(`gpuwarden ps --runs DIR`, `gpuwarden exec`'s own output) build the same answers here, so a run
looks the same whoever hosts it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from gpuwarden.core.api import EventsPage, LogChunk, RunDetail, RunSummary
from gpuwarden.core.api.runs import Attempt, Retune
from gpuwarden.core.command.record import attempt_dir, with_records
from gpuwarden.core.command.resume import resume_facts
from gpuwarden.core.errors import UserError
from gpuwarden.core.exit_record import STATUS_FILE, read_peak_rss, read_program_pid
from gpuwarden.core.logtail import NO_LOG, log_chunk, read_log
from gpuwarden.core.oom.roles import effective_batch_of
from gpuwarden.core.report.energy import stored_energy
from gpuwarden.core.run_state import FINAL_STATES, RunState
from gpuwarden.core.safeload import read_json_file
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore

Stream = Literal["stdout", "stderr"]
# A gang writes a `started` event per rank and attempt: every one is read, however long the run.
_RESUME_EVENTS_LIMIT = 1_000_000


def run_detail(
    store: RunStore, telemetry: TelemetryStore, run: Mapping[str, Any], live_program: int | None = None
) -> RunDetail:
    """A run whole: the row, its attempts and retunes, the effective batch, its report and energy.
    `live_program`: the pid of the program its running attempt runs, where its host knows it."""
    run_dir = Path(run["run_dir"])
    return RunDetail.model_validate(
        {
            **RunSummary.from_row(run).model_dump(),
            "run_dir": run["run_dir"],
            "stop_requested": run["stop_requested"],
            "spec": run["spec"],
            "submitted_spec": run["submitted_spec"],
            "attempts": attempt_models(store, run, live_program),
            "retunes": [Retune.model_validate(r) for r in store.retunes(run["id"])],
            "effective_batch": effective_batch_of(run["spec"]),
            "report": read_report(run_dir / "report.json"),
            # J/sample and samples/kWh of the run and of each attempt (None without a counter).
            "energy": stored_energy(store, telemetry, run["id"], time.time()),
        }
    )


def attempt_models(store: RunStore, run: Mapping[str, Any], live_program: int | None = None) -> list[Attempt]:
    """The run's attempts with their program's pid: `live_program` for the one running, from the
    exit record for one that ended (a command's own program, not the recorder that started it)."""
    run_dir = Path(run["run_dir"])
    rows = with_records(run_dir, store.attempts(run["id"]))
    live = live_program if run["state"] == RunState.RUNNING else None
    said = resume_facts(store.events(run["id"], types=("started", "warning"), limit=_RESUME_EVENTS_LIMIT))
    return [
        Attempt.model_validate(
            {
                **a,
                "program_pid": _program_pid(run_dir, a, live),
                "peak_rss": _peak_rss(run_dir, a),
                **said.of(a["attempt"], a["prepared"]),
            }
        )
        for a in rows
    ]


def _peak_rss(run_dir: Path, attempt: dict[str, Any]) -> int | None:
    if attempt["state"] != "ended":
        return None
    return read_peak_rss(str(attempt_dir(run_dir, int(attempt["attempt"])) / STATUS_FILE))


def _program_pid(run_dir: Path, attempt: dict[str, Any], live: int | None) -> int | None:
    if attempt["state"] != "ended":
        return live
    return read_program_pid(str(attempt_dir(run_dir, int(attempt["attempt"])) / STATUS_FILE))


def read_report(path: Path) -> dict[str, Any] | None:
    """The run's report.json (None before it is written; what went wrong when unreadable)."""
    if not path.exists():
        return None
    try:
        report = read_json_file(path, what="run report")
    except UserError as exc:  # a command run's program may write anything there
        return {"unreadable": exc.message}
    return report if isinstance(report, dict) else {"unreadable": "not a JSON object"}


def events_page(store: RunStore, run_id: str, since: int, limit: int) -> EventsPage:
    """The run's events with an id above `since`, and its state now ("deleted" when it is gone)."""
    rows = store.events(run_id, since=since, limit=limit)
    current = store.get_run(run_id)
    return EventsPage.model_validate(
        {
            "events": rows,
            "next_since": rows[-1]["id"] if rows else since,
            "state": current["state"] if current else "deleted",
        }
    )


def log_target(
    store: RunStore, run: Mapping[str, Any], attempt: int | None, stream: Stream
) -> tuple[int, Path | None]:
    """(the attempt meant, the path of its `stream`): the latest attempt when `attempt` is None;
    (0, None) before the first; UserError not_found for an attempt the run does not have."""
    number = attempt or int(run["attempt"])
    if number == 0:
        return 0, None
    row = store.attempt(run["id"], number)
    if row is None:
        raise UserError(
            f"run {run['id']} has no attempt {number} (it has {run['attempt']})", code="not_found"
        )
    return number, Path(row[f"{stream}_path"])


def log_slice(
    store: RunStore,
    run: Mapping[str, Any],
    attempt: int | None,
    stream: Stream,
    offset: int | None,
    limit: int,
) -> LogChunk:
    """A slice of an attempt's output, as `GET /v1/runs/{ref}/logs` answers without waiting."""
    number, path = log_target(store, run, attempt, stream)
    if path is None:
        return log_chunk(NO_LOG, ended=run["state"] in FINAL_STATES, attempt=0, stream=stream)
    piece = read_log(path, offset, limit)
    return log_chunk(piece, ended=attempt_ended(store, run["id"], number), attempt=number, stream=stream)


def attempt_ended(store: RunStore, run_id: str, number: int) -> bool:
    """Whether the attempt has ended (or is gone with its run)."""
    row = store.attempt(run_id, number)
    return row is None or str(row["state"]) == "ended"
