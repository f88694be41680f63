"""`attempts/<n>/prepared.json`: what gpuwarden handed one attempt of a user's program.

Written before the attempt starts, read by the run detail (API, CLI `show`, dashboard): the argv
as run, the knob values, the environment variables bound to knobs, the config copy with its
changed keys and its diff against the user's file, and the checkpoint it resumes from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD_NAME = "prepared.json"


def attempt_dir(run_dir: Path, number: int) -> Path:
    return run_dir / "attempts" / str(number)


def write_record(run_dir: Path, number: int, record: dict[str, Any]) -> Path:
    """Write the record atomically (a reader never sees half of it)."""
    path = attempt_dir(run_dir, number) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_record(run_dir: Path, number: int) -> dict[str, Any] | None:
    """The attempt's record, or None (a train/infer run, or an attempt from before records)."""
    try:
        data = json.loads((attempt_dir(run_dir, number) / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def with_records(run_dir: Path, attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run detail's attempts, each with its `prepared` record (None where there is none)."""
    return [{**a, "prepared": read_record(run_dir, int(a["attempt"]))} for a in attempts]


def summary_lines(record: dict[str, Any]) -> list[str]:
    """What a person reads under an attempt: the changes against the user's own files."""
    lines: list[str] = []
    config = record.get("config") or {}
    changes = config.get("changes") or {}
    if changes:
        shown = ", ".join(f"{k} {old} → {new}" for k, (old, new) in changes.items())
        lines.append(f"config {config.get('copy')}: {shown}")
    elif config:
        lines.append(f"config {config.get('copy')}: same as {config.get('source')}")
    for name, value in (record.get("env") or {}).items():
        lines.append(f"env {name}={value}")
    if record.get("resume_note"):
        lines.append(str(record["resume_note"]))
    diff = config.get("diff") or ""
    lines.extend(diff.rstrip("\n").splitlines())
    return lines
