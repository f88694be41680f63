"""`attempts/<n>/prepared.json`: what gpuwarden handed one attempt of a user's program.

Written before the attempt starts, read by the run detail (API, CLI `show`, dashboard): the argv
as run, the knob values, the environment variables bound to knobs, the config copy with its
changed keys and its diff against the user's file, and the checkpoint it resumes from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuwarden.core.api.runs import AttemptRecord
from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import EVENT_LIMITS, read_text_file

RECORD_NAME = "prepared.json"


def attempt_dir(run_dir: Path, number: int) -> Path:
    return run_dir / "attempts" / str(number)


def write_record(run_dir: Path, number: int, record: AttemptRecord) -> Path:
    """Write the record atomically (a reader never sees half of it)."""
    path = attempt_dir(run_dir, number) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_record(run_dir: Path, number: int) -> AttemptRecord | None:
    """The attempt's record, or None (a train/infer run, an attempt from before records, or a
    file that is not a record: the run folder is the user's to edit)."""
    try:
        # Read within bounds: the API reads it on a request thread, and a link to /dev/zero or a
        # FIFO put there must not hold that thread.
        text = read_text_file(attempt_dir(run_dir, number) / RECORD_NAME, EVENT_LIMITS)
        return AttemptRecord.model_validate_json(text)
    except (UserError, ValueError, ValidationError):
        return None


def mark_started_warm(run_dir: Path, number: int) -> None:
    """Say in the attempt's record that it started warm (nothing when it has no record)."""
    record = read_record(run_dir, number)
    if record is not None:
        write_record(run_dir, number, record.model_copy(update={"started_warm": True}))


def with_records(run_dir: Path, attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run detail's attempts, each with its `prepared` record (None where there is none)."""
    return [{**a, "prepared": read_record(run_dir, int(a["attempt"]))} for a in attempts]


def summary_lines(record: AttemptRecord, resumed_from: str | None = None) -> list[str]:
    """What a person reads under an attempt: the changes against the user's own files, and what
    it resumed from (`resumed_from`: the attempt's, which the program's own report may name)."""
    lines: list[str] = []
    config = record.config
    if config is not None and config.changes:
        lines.append(f"config {config.path}: {changes_text(config.changes)}")
    elif config is not None:
        lines.append(f"config {config.path}: same as {config.source}")
    lines.extend(f"env {name}={value}" for name, value in record.env.items())
    if resumed_from and resumed_from != record.resume_from:
        # The program loaded a checkpoint its command was not handed (through the SDK, or its
        # framework's own): its word replaces the note written before it started.
        lines.append(f"resumed from {resumed_from} (the program reported loading it)")
    elif record.resume_note:
        lines.append(record.resume_note)
    if record.started_warm:
        lines.append("started warm: its libraries were imported while the last attempt ran")
    if config is not None:
        lines.extend(config.diff.rstrip("\n").splitlines())
    return lines


def changes_text(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """`training.batch_size 16 → 4, resume_from_checkpoint set to /ckpt/7`: a key the user's file
    did not have is set, not changed from a `None` the file never held."""
    return ", ".join(
        f"{k} set to {new}" if old is None else f"{k} {old} → {new}" for k, (old, new) in changes.items()
    )
