"""Queries over the run tables: what the supervisor writes and what the API reads.

Writers call these from the daemon's single store-writer thread; readers use a read-only
connection. Each write method is one transaction, so a crash leaves the row either before or after
the change, never half of it (events and their file offset in particular move together).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from gpuwarden.core.errors import UserError
from gpuwarden.core.gang.files import rank_events_path
from gpuwarden.core.gang.ranks import RANK_EVENT_TYPES, rank_view
from gpuwarden.core.report.samples import samples_done
from gpuwarden.core.run_ref import MAX_REF_CHARS
from gpuwarden.core.run_state import RunState, check_transition
from gpuwarden.core.store.attempt_energy import counter_joules
from gpuwarden.core.store.transaction import transaction
from gpuwarden.core.submission import Submission, SubmittedRun

_METRIC_FIELDS = (
    "step",
    "samples_seen",
    "tokens_seen",
    "loss",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "batch_size",
    "mem_allocated",
    "mem_reserved",
    "mem_peak",
)
_JSON_RUN_COLUMNS = ("spec", "submitted_spec")
# What belongs to a run besides its row, removed with it.
_RUN_TABLES = ("run_metrics", "retunes", "run_events", "rank_offsets", "attempts", "run_environments")
# What a `restart` daemon event says, as an attempt's `restart` carries it.
RESTART_FIELDS = ("cause", "restart", "max", "backoff_s")
# What tells where an attempt resumed (see gpuwarden.core.report.samples); every one of them,
# however long the run: a base read from a cut-off page would count samples twice.
_RESUME_EVENT_TYPES = ("started", "checkpoint", "prepared")
_RESUME_EVENTS_LIMIT = 1_000_000
# Not "state": a state moves only through set_state (or add_attempt), which check the move.
_RUN_UPDATABLE = {
    "spec",
    "name",
    "updated_at",
    "started_at",
    "ended_at",
    "attempt",
    "message",
    "stop_requested",
}
_ATTEMPT_UPDATABLE = {
    "state",
    "pid",
    "create_time",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "classification",
    "reason",
    "adopted",
    "gpus",
    "oom_kill_before",
}


def _row_dict(cursor: sqlite3.Cursor, row: Sequence[Any]) -> dict[str, Any]:
    return {d[0]: row[i] for i, d in enumerate(cursor.description)}


class RunStore:
    """Runs, attempts, run events, retunes and run metrics in one SQLite database.

    Every time it stamps (created, updated, started, ended, its own events) comes from `clock`:
    the daemon passes its supervisor's, so a run's times agree with the attempt times the
    supervisor records, under a test's clock too.
    """

    def __init__(self, db: sqlite_utils.Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.conn: sqlite3.Connection = db.conn
        self.clock = clock

    # -- reading -------------------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, params)
        return [_row_dict(cursor, row) for row in cursor.fetchall()]

    @staticmethod
    def _decode_run(row: dict[str, Any]) -> dict[str, Any]:
        for column in _JSON_RUN_COLUMNS:
            row[column] = json.loads(row[column])
        row["stop_requested"] = bool(row["stop_requested"])
        return row

    @staticmethod
    def _decode_attempt(row: dict[str, Any]) -> dict[str, Any]:
        row["gpus"] = json.loads(row["gpus"])
        row["adopted"] = bool(row["adopted"])
        return row

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The run with this exact id, or None."""
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        return self._decode_run(rows[0]) if rows else None

    def list_runs(
        self, states: Sequence[str] | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Runs, newest first, optionally only those in `states`."""
        sql = "SELECT * FROM runs"
        params: list[Any] = []
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            params.extend(states)
        sql += " ORDER BY created_at DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [self._decode_run(r) for r in self._query(sql, params)]

    def resolve(self, ref: str) -> dict[str, Any]:
        """A run by id, exact name (the newest such run), or a unique id/name prefix.

        Raises UserError code `not_found` or `ambiguous`.
        """
        if not ref or len(ref) > MAX_REF_CHARS:
            # Names are at most 64 characters; a longer reference (which SQLite's LIKE refuses
            # past ~50 000 characters) names no run.
            raise UserError(f"no run matches '{ref[:80]}' — see `gpuwarden ps`", code="not_found")
        run = self.get_run(ref)
        if run is not None:
            return run
        by_name = self._query(
            "SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC, rowid DESC LIMIT 1", (ref,)
        )
        if by_name:
            return self._decode_run(by_name[0])
        escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query(
            "SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' OR name LIKE ? ESCAPE '\\'"
            " ORDER BY created_at DESC, rowid DESC",
            (escaped + "%", escaped + "%"),
        )
        if len(rows) == 1 or _one_name(rows, ref):
            return self._decode_run(rows[0])  # the newest, as the whole name gives
        if not rows:
            raise UserError(f"no run matches '{ref}' — see `gpuwarden ps`", code="not_found")
        names = ", ".join(f"{r['id']} ({r['name']})" for r in rows[:5])
        raise UserError(f"'{ref}' matches several runs: {names} — give more of the id", code="ambiguous")

    def ids_named(self, name: str) -> list[str]:
        """The ids of the runs called `name`, newest first."""
        rows = self._query("SELECT id FROM runs WHERE name = ? ORDER BY created_at DESC, rowid DESC", (name,))
        return [str(r["id"]) for r in rows]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        """Every attempt of a run, oldest first; `restart` is the restart the run's restart policy
        scheduled after it ({cause, restart, max, backoff_s}), or None; `gpu_energy_j` the joules
        each GPU used between the counter readings at its start and end (where both were read)."""
        rows = self._query("SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,))
        restarts = {e["attempt"]: e for e in self.events(run_id, limit=100_000, types=("restart",))}
        measured = counter_joules(self.conn, run_id)
        out = []
        for row in rows:
            event = restarts.get(row["attempt"])
            restart = {k: event.get(k) for k in RESTART_FIELDS} if event else None
            attempt = self._decode_attempt(row)
            energy = measured.get(int(row["attempt"]), {})
            out.append({**attempt, "restart": restart, "ranks": self.ranks(attempt), "gpu_energy_j": energy})
        return out

    def ranks(self, attempt: dict[str, Any]) -> list[dict[str, Any]]:
        """Each rank of a multi-process attempt as `gpuwarden.core.gang.ranks.rank_view` shows it
        (its GPU, memory, last step; the straggler marked); [] for a one-process attempt."""
        world = int(attempt.get("world_size") or 1)
        if world <= 1:
            return []
        run_id, number = attempt["run_id"], attempt["attempt"]
        latest: dict[tuple[int, str], dict[str, Any]] = {}
        for type_ in RANK_EVENT_TYPES:
            # The newest event of this type per rank, found through the (run_id, id) index.
            rows = self._query(
                "SELECT payload FROM run_events WHERE id IN (SELECT MAX(id) FROM run_events"
                " WHERE run_id = ? AND attempt = ? AND source = 'runner' AND type = ?"
                " GROUP BY json_extract(payload, '$.rank'))",
                (run_id, number, type_),
            )
            for row in rows:
                event = json.loads(row["payload"])
                rank = event.get("rank")
                if isinstance(rank, int) and not isinstance(rank, bool):
                    latest[(rank, type_)] = event
        hang = self._query(
            "SELECT payload FROM run_events WHERE run_id = ? AND attempt = ? AND source = 'daemon'"
            " AND type = 'hang' ORDER BY id DESC LIMIT 1",
            (run_id, number),
        )
        return rank_view(world, attempt["gpus"], latest, json.loads(hang[0]["payload"]) if hang else None)

    def rank_offsets(self, run_id: str, attempt: int) -> dict[int, tuple[str, int]]:
        """Rank → (its events file, bytes of it already stored), for the ranks after rank 0."""
        rows = self._query(
            "SELECT rank, events_path, events_offset FROM rank_offsets WHERE run_id = ? AND attempt = ?"
            " ORDER BY rank",
            (run_id, attempt),
        )
        return {int(r["rank"]): (str(r["events_path"]), int(r["events_offset"])) for r in rows}

    def attempt(self, run_id: str, attempt: int) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM attempts WHERE run_id = ? AND attempt = ?", (run_id, attempt))
        return self._decode_attempt(rows[0]) if rows else None

    def live_attempts(self) -> list[dict[str, Any]]:
        """Attempts not yet ended, with their run's state: what a restarted daemon must re-adopt."""
        rows = self._query(
            "SELECT a.* FROM attempts a JOIN runs r ON r.id = a.run_id WHERE a.state != 'ended'"
            " ORDER BY r.created_at, r.rowid"
        )
        return [self._decode_attempt(r) for r in rows]

    def events(
        self, run_id: str, since: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Events with id > `since`, oldest first; each is the stored event plus id/attempt/source."""
        sql = "SELECT id, attempt, ts, type, source, payload FROM run_events WHERE run_id = ? AND id > ?"
        params: list[Any] = [run_id, since]
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            params.extend(types)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        out = []
        for row in self._query(sql, params):
            event = json.loads(row.pop("payload"))
            event.update(row)
            out.append(event)
        return out

    def last_event(
        self, run_id: str, attempt: int, types: Sequence[str], source: str = "runner"
    ) -> dict[str, Any] | None:
        """The newest event of one of `types` in an attempt, from the runner (or the daemon)."""
        rows = self._query(
            f"SELECT payload FROM run_events WHERE run_id = ? AND attempt = ? AND source = ?"
            f" AND type IN ({','.join('?' * len(types))}) ORDER BY id DESC LIMIT 1",
            (run_id, attempt, source, *types),
        )
        return json.loads(rows[0]["payload"]) if rows else None

    def snapshot(self) -> list[dict[str, Any]]:
        """Every run with its attempt and retune counts and its latest progress metrics, in one
        query (what the Prometheus exporter reads on each scrape)."""
        return self._query(
            "SELECT r.id, r.name, r.kind, r.state, r.ended_at, r.attempt AS attempts,"
            " (SELECT COUNT(*) FROM retunes t WHERE t.run_id = r.id) AS retunes,"
            " m.samples_per_s, m.tokens_per_s, m.samples_seen, m.loss, m.mem_peak"
            " FROM runs r LEFT JOIN run_metrics m ON m.rowid ="
            " (SELECT rowid FROM run_metrics WHERE run_id = r.id ORDER BY ts DESC LIMIT 1)"
            " ORDER BY r.created_at, r.rowid"
        )

    def max_event_id(self) -> int:
        row = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM run_events").fetchone()
        return int(row[0])

    def retunes(self, run_id: str) -> list[dict[str, Any]]:
        """Retune records of a run, oldest first, JSON columns decoded."""
        rows = self._query("SELECT * FROM retunes WHERE run_id = ? ORDER BY id", (run_id,))
        for row in rows:
            for column in ("from_json", "to_json", "evidence_json", "prediction_json"):
                value = row.pop(column)
                row[column.removesuffix("_json")] = json.loads(value) if value is not None else None
        return rows

    def samples_done(self, run_id: str) -> dict[int, int]:
        """Samples each attempt did: its last progress count over the count it resumed from."""
        counts = {
            # `or 0` also for an infinity an older version stored: counts are whole numbers
            int(row["attempt"]): (int(_number(row["first"]) or 0), int(_number(row["last"]) or 0))
            for row in self._query(
                "SELECT attempt, min(samples_seen) AS first, max(samples_seen) AS last FROM run_metrics"
                " WHERE run_id = ? GROUP BY attempt",
                (run_id,),
            )
        }
        if not counts:
            return {}
        events = self.events(run_id, types=_RESUME_EVENT_TYPES, limit=_RESUME_EVENTS_LIMIT)
        return samples_done(counts, events)

    def metrics(self, run_id: str, limit: int = 10_000) -> list[dict[str, Any]]:
        """Progress metrics of a run, oldest first."""
        return self._query(
            "SELECT * FROM run_metrics WHERE run_id = ? ORDER BY ts LIMIT ?",
            (run_id, limit),
        )

    # -- writing -------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        name: str,
        kind: str,
        spec: dict[str, Any],
        run_dir: str,
        message: str | None = None,
        environment: Mapping[str, str] | None = None,
        submission: Submission | None = None,
    ) -> None:
        """Insert a queued run (with the environment its processes start from, and the key its
        submit was sent with, when given)."""
        now = self.clock()
        with transaction(self.conn):
            self.conn.execute(
                "INSERT INTO runs (id, name, kind, state, spec, submitted_spec, run_dir, created_at,"
                " updated_at, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    name,
                    kind,
                    str(RunState.QUEUED),
                    json.dumps(spec),
                    json.dumps(spec),
                    run_dir,
                    now,
                    now,
                    message,
                ),
            )
            payload = {"v": 1, "type": "state", "ts": now, "state": str(RunState.QUEUED), "message": message}
            self.conn.execute(
                "INSERT INTO run_events (run_id, attempt, ts, type, source, payload)"
                " VALUES (?, 0, ?, 'state', 'daemon', ?)",
                (run_id, now, json.dumps(payload)),
            )
            if environment is not None:
                self.conn.execute(
                    "INSERT INTO run_environments (run_id, variables) VALUES (?, ?)",
                    (run_id, json.dumps(dict(environment))),
                )
            if submission is not None and submission.key is not None:
                self.conn.execute(
                    "INSERT INTO run_submissions (key, run_id, digest) VALUES (?, ?, ?)",
                    (submission.key, run_id, submission.digest),
                )

    def submitted_as(self, key: str) -> SubmittedRun | None:
        """The run a submit sent with `key` queued, if one did (and was not deleted since)."""
        row = self.conn.execute("SELECT run_id, digest FROM run_submissions WHERE key = ?", (key,)).fetchone()
        return SubmittedRun(run_id=row[0], digest=row[1]) if row else None

    def environment(self, run_id: str) -> dict[str, str] | None:
        """The environment the run was submitted with (None: it was submitted without one)."""
        sql = "SELECT variables FROM run_environments WHERE run_id = ?"
        row = self.conn.execute(sql, (run_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def set_environment(self, run_id: str, environment: Mapping[str, str]) -> None:
        """Replace the environment the run's processes start from (a job started again in a new
        allocation: its variables are that allocation's, not the first one's)."""
        with transaction(self.conn):
            self.conn.execute(
                "INSERT INTO run_environments (run_id, variables) VALUES (?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET variables = excluded.variables",
                (run_id, json.dumps(dict(environment))),
            )

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set columns of a run (spec as a dict); updated_at is set to now."""
        self._update("runs", _RUN_UPDATABLE, "id = ?", (run_id,), fields)

    def update_attempt(self, run_id: str, attempt: int, **fields: Any) -> None:
        """Set columns of an attempt (gpus as a list)."""
        self._update("attempts", _ATTEMPT_UPDATABLE, "run_id = ? AND attempt = ?", (run_id, attempt), fields)

    def _update(
        self, table: str, allowed: set[str], where: str, key: tuple[Any, ...], fields: dict[str, Any]
    ) -> None:
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"{table}: cannot update {sorted(unknown)}")
        if table == "runs":
            fields.setdefault("updated_at", self.clock())
        values = [json.dumps(v) if k in ("spec", "gpus") else v for k, v in fields.items()]
        assignments = ", ".join(f"{k} = ?" for k in fields)
        with transaction(self.conn):
            self.conn.execute(f"UPDATE {table} SET {assignments} WHERE {where}", (*values, *key))

    def set_state(self, run_id: str, state: str, message: str | None = None, **fields: Any) -> dict[str, Any]:
        """Move a run to `state` (checked against the state table), recording a `state` daemon
        event in the same transaction; returns that event (with its id)."""
        with transaction(self.conn):
            return self._move(run_id, state, message, fields, self.clock())

    def _move(
        self, run_id: str, state: str, message: str | None, fields: dict[str, Any], now: float
    ) -> dict[str, Any]:
        """`set_state` inside a transaction the caller holds: the only place a run's state is
        written."""
        # Read and write in one transaction: the move is checked against the state it replaces.
        row = self.conn.execute("SELECT attempt, state FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UserError(f"no run '{run_id}'", code="not_found")
        attempt, current = row
        target = check_transition(run_id, current, state)
        fields["updated_at"] = now
        if target.final:
            fields.setdefault("ended_at", now)
        if target is RunState.SUCCEEDED:
            # Nothing starts a succeeded run again: the tokens and paths of the environment it
            # was submitted with are not kept past their use.
            self.conn.execute("DELETE FROM run_environments WHERE run_id = ?", (run_id,))
        values = [json.dumps(v) if k == "spec" else v for k, v in fields.items()]
        assignments = "".join(f", {k} = ?" for k in fields)
        self.conn.execute(
            f"UPDATE runs SET state = ?, message = ?{assignments} WHERE id = ?",
            (str(target), message, *values, run_id),
        )
        payload = {"v": 1, "type": "state", "ts": now, "state": str(target), "message": message}
        cursor = self.conn.execute(
            "INSERT INTO run_events (run_id, attempt, ts, type, source, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, attempt, now, "state", "daemon", json.dumps(payload)),
        )
        return {**payload, "id": int(cursor.lastrowid or 0), "attempt": attempt, "source": "daemon"}

    def add_attempt(
        self,
        run_id: str,
        attempt: int,
        *,
        stdout_path: str,
        stderr_path: str,
        events_path: str,
        gpus: list[str],
        spec: dict[str, Any] | None = None,
        world_size: int = 1,
        message: str | None = None,
    ) -> dict[str, Any]:
        """Record a new attempt (state `starting`), make it the run's current one and move the run
        to `starting` with `message` (checked as `set_state` checks a move), in one transaction;
        returns the run's `state` event. An attempt of `world_size` > 1 processes also gets an
        events offset for each rank after rank 0."""
        now = self.clock()
        with transaction(self.conn):
            self.conn.execute(
                "INSERT INTO attempts (run_id, attempt, state, started_at, stdout_path, stderr_path,"
                " events_path, gpus, world_size) VALUES (?, ?, 'starting', ?, ?, ?, ?, ?, ?)",
                (run_id, attempt, now, stdout_path, stderr_path, events_path, json.dumps(gpus), world_size),
            )
            for rank in range(1, world_size):
                self.conn.execute(
                    "INSERT INTO rank_offsets (run_id, attempt, rank, events_path) VALUES (?, ?, ?, ?)",
                    (run_id, attempt, rank, str(rank_events_path(Path(events_path), rank))),
                )
            self.conn.execute(
                "UPDATE runs SET attempt = ?, started_at = COALESCE(started_at, ?), ended_at = NULL,"
                " stop_requested = 0 WHERE id = ?",
                (attempt, now, run_id),
            )
            fields = {} if spec is None else {"spec": spec}
            return self._move(run_id, RunState.STARTING, message, fields, now)

    def add_events(
        self,
        run_id: str,
        attempt: int,
        events: Sequence[dict[str, Any]],
        new_offset: int,
        skipped: int = 0,
        rank: int = 0,
    ) -> list[int]:
        """Store runner events and the offset they end at in their file (rank 0's: the attempt's
        events.jsonl; another rank's: its own), atomically; returns their ids.

        Progress events also become run_metrics rows; in a gang only rank 0's (the gang's step,
        samples and loss; every rank's memory stays in its events).
        """
        ids: list[int] = []
        with transaction(self.conn):
            for event in events:
                cursor = self.conn.execute(
                    "INSERT INTO run_events (run_id, attempt, ts, type, source, payload)"
                    " VALUES (?, ?, ?, ?, 'runner', ?)",
                    (run_id, attempt, float(event["ts"]), str(event["type"]), json.dumps(event)),
                )
                ids.append(int(cursor.lastrowid or 0))
                if event["type"] == "progress" and rank == 0:
                    values = [_number(event.get(f)) for f in _METRIC_FIELDS]
                    self.conn.execute(
                        f"INSERT INTO run_metrics (run_id, attempt, ts, {', '.join(_METRIC_FIELDS)})"
                        f" VALUES (?, ?, ?, {', '.join('?' * len(_METRIC_FIELDS))})",
                        (run_id, attempt, float(event["ts"]), *values),
                    )
            table = "attempts" if rank == 0 else "rank_offsets"
            where = "run_id = ? AND attempt = ?" + ("" if rank == 0 else " AND rank = ?")
            self.conn.execute(
                f"UPDATE {table} SET events_offset = ?, events_skipped = events_skipped + ? WHERE {where}",
                (new_offset, skipped, run_id, attempt, *(() if rank == 0 else (rank,))),
            )
        return ids

    def add_daemon_event(
        self, run_id: str, attempt: int | None, type_: str, payload: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """An event the daemon itself says about a run (placement warnings, adoption,
        classification); returns it as stored, with its id (what the live stream sends)."""
        now = self.clock()
        body = {"v": 1, "type": type_, "ts": now, **(payload or {})}
        with transaction(self.conn):
            cursor = self.conn.execute(
                "INSERT INTO run_events (run_id, attempt, ts, type, source, payload)"
                " VALUES (?, ?, ?, ?, 'daemon', ?)",
                (run_id, attempt, now, type_, json.dumps(body)),
            )
        return {**body, "id": int(cursor.lastrowid or 0), "attempt": attempt, "source": "daemon"}

    def add_retune(
        self,
        run_id: str,
        attempt: int,
        from_: dict[str, Any],
        to: dict[str, Any],
        verdict: str | None = None,
        evidence: dict[str, Any] | None = None,
        prediction: dict[str, Any] | None = None,
        spec: dict[str, Any] | None = None,
    ) -> int:
        """Record a retune decision, and with `spec` the run's new spec in the same transaction
        (a crash never leaves a decision recorded for a spec that was not changed, or the reverse)."""
        now = self.clock()
        with transaction(self.conn):
            if spec is not None:
                self.conn.execute(
                    "UPDATE runs SET spec = ?, updated_at = ? WHERE id = ?", (json.dumps(spec), now, run_id)
                )
            cursor = self.conn.execute(
                "INSERT INTO retunes (run_id, attempt, ts, from_json, to_json, verdict, evidence_json,"
                " prediction_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    attempt,
                    now,
                    json.dumps(from_),
                    json.dumps(to),
                    verdict,
                    json.dumps(evidence) if evidence is not None else None,
                    json.dumps(prediction) if prediction is not None else None,
                ),
            )
        return int(cursor.lastrowid or 0)

    def set_retune_outcome(self, run_id: str, outcome: str) -> None:
        """Fill the outcome of the run's latest retune that has none yet."""
        with transaction(self.conn):
            self.conn.execute(
                "UPDATE retunes SET outcome = ? WHERE id = (SELECT MAX(id) FROM retunes WHERE run_id = ?"
                " AND outcome IS NULL)",
                (outcome, run_id),
            )

    def delete_run(self, run_id: str) -> None:
        """Remove a run and (by cascade) its attempts, events, retunes, metrics and environment."""
        with transaction(self.conn):
            for table in _RUN_TABLES:
                self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def _number(value: Any) -> float | int | None:
    """A metric as stored: None for anything but a finite number (a diverged loss of Infinity, a
    script's 1e400): no JSON answer carries infinity, and counts are summed as integers. None too
    for an integer past SQLite's 64 bits (a script's 10**30), which SQLite refuses to store."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    return value if math.isfinite(value) else None


def _one_name(rows: list[Any], ref: str) -> bool:
    """The runs a prefix matches are runs of one name, and no id starts with it: the prefix reads
    as that name does (its newest run)."""
    return len({r["name"] for r in rows}) == 1 and not any(str(r["id"]).startswith(ref) for r in rows)
