"""One attempt of a user's program, prepared: argv, environment, working directory, files.

The supervisor calls `prepare_attempt` and spawns what it returns. Everything a command run's
attempt needs is decided here: the newest complete checkpoint as `{resume_from}`, the attempt's
copy of the user's config file with the knobs' keys changed (the user's file is only read),
variables bound to knobs, and the record (`attempts/<n>/prepared.json`) that the run detail
shows as the attempt's diff.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.api.runs import AttemptRecord, ConfigCopy
from gpuwarden.core.command.accumulation_counter import counter_warning
from gpuwarden.core.command.checkpoints import FoundCheckpoint, newest_checkpoint
from gpuwarden.core.command.config_file import ConfigDocument, load_config, unified_diff
from gpuwarden.core.command.other_checkpoints import other_checkpoint, other_checkpoint_note
from gpuwarden.core.command.record import attempt_dir, changes_text, read_record, write_record
from gpuwarden.core.command.resume import passes_resume, unpassed_note
from gpuwarden.core.command.saved_config import set_aside, set_aside_note
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.templating import render, render_argv, template_values

# What a program (or the SDK inside it) reads to find its events file and its restart point.
ENV_EVENTS_FILE = "GPUWARDEN_EVENTS_FILE"
ENV_RUN_ID = "GPUWARDEN_RUN_ID"
ENV_ATTEMPT = "GPUWARDEN_ATTEMPT"
ENV_RESUME_FROM = "GPUWARDEN_RESUME_FROM"


@dataclass(frozen=True)
class PreparedAttempt:
    argv: list[str]
    env: dict[str, str]  # to add to the daemon's environment (placement variables go over it)
    cwd: Path
    record: AttemptRecord
    note: str  # one line for the run's events; "" when there is nothing to say
    warning: str = ""  # why its resume will differ from an uninterrupted run (an inexact_resume)


def env_text(value: Any) -> str:
    """A knob's value as an environment variable holds it (booleans lower-case, like YAML)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _first_started(run_dir: Path, attempt: int, now: float) -> float:
    first = read_record(run_dir, 1) if attempt > 1 else None
    return first.prepared_at if first is not None else now


def _pattern(spec: RunSpec, values: dict[str, Any]) -> str | None:
    assert spec.command is not None
    checkpoints = spec.command.checkpoints
    return render(checkpoints.glob, values, "command.checkpoints.glob") if checkpoints else None


def _find_resume(
    spec: RunSpec, values: dict[str, Any], run_dir: Path, attempt: int, cwd: Path, since: float
) -> FoundCheckpoint | None:
    assert spec.command is not None
    checkpoints = spec.command.checkpoints
    complete_when = checkpoints.complete_when if checkpoints else None
    return newest_checkpoint(run_dir, attempt, cwd, _pattern(spec, values), complete_when, since)


def _written_to(spec: RunSpec, values: dict[str, Any], cwd: Path) -> list[Path]:
    """The folders the program writes its output to, as far as the spec tells: its working
    folder, its output_dir knob's, and the fixed part of where its checkpoints are looked for."""
    assert spec.command is not None
    folders = [cwd]
    knob = spec.command.roles.output_dir
    if knob and isinstance(values.get(knob), str) and values[knob]:
        folders.append(cwd / Path(values[knob]).expanduser())
    pattern = _pattern(spec, values)
    if pattern:
        fixed = pattern.split("*")[0].split("?")[0].split("[")[0]
        folders.append(cwd / Path(fixed if fixed.endswith("/") else os.path.dirname(fixed)).expanduser())
    return folders


def _scratch_note(spec: RunSpec, values: dict[str, Any], attempt: int, cwd: Path, since: float) -> str:
    """Why an attempt starts from the beginning: nothing was written, or a checkpoint of another
    framework's layout was (the spec's preset is likely the wrong one)."""
    assert spec.command is not None
    other = other_checkpoint(_written_to(spec, values, cwd), spec.command.framework, since)
    pattern = _pattern(spec, values)
    if other is not None:
        return other_checkpoint_note(attempt, pattern, other)
    if pattern is None:
        # Nothing says where the program keeps its progress: it may well take it up by itself (its
        # own output so far, a checkpoint folder it looks in), which gpuwarden cannot see.
        return (
            f"attempt {attempt} is given no checkpoint (the spec names none: --checkpoints GLOB, and "
            "the program reported none): it starts from the beginning unless it picks up its own progress"
        )
    return f"attempt {attempt} starts from scratch: no complete checkpoint from an earlier attempt"


def _resume_note(spec: RunSpec, attempt: int, found: FoundCheckpoint | None, scratch: str) -> str:
    assert spec.command is not None
    if attempt <= 1:
        return ""
    if found is None:
        return scratch
    if not passes_resume(spec.command, spec.knobs):
        return unpassed_note(spec.command, attempt, found.path, found.step, found.source == "event")
    step = f" (step {found.step})" if found.step is not None else ""
    return f"attempt {attempt} resumes from {found.path}{step}"


def _set_switch(doc: ConfigDocument, key: str, on: bool, changes: dict[str, tuple[Any, Any]]) -> None:
    """A switch of a `flags` binding: set where it differs (an absent switch is off already)."""
    try:
        current: Any = doc.get(key)
    except KeyError:
        current = None
    if current is on or (current is None and not on):
        return
    doc.set(key, on)
    changes[key] = (current, on)


def _config_copy(spec: RunSpec, knobs: dict[str, Any], copy: Path, resume_from: str) -> ConfigCopy:
    """Write the attempt's copy of the user's config file; its record (changes and diff)."""
    command = spec.command
    assert command is not None and command.config_file is not None
    doc = load_config(command.config_file)
    changes: dict[str, tuple[Any, Any]] = {}
    for name, binding in command.bind.items():
        for key, when in (binding.flags or {}).items():
            _set_switch(doc, key, env_text(knobs[name]) == env_text(when), changes)
        if binding.config is None:
            continue
        try:
            current: Any = doc.get(binding.config)
        except KeyError:
            current = binding.default
        value = knobs[name]
        if current != value or type(current) is not type(value):
            doc.set(binding.config, value)
            changes[binding.config] = (current, value)
    if command.checkpoints and command.checkpoints.config_key and resume_from:
        key = command.checkpoints.config_key
        try:
            old = doc.get(key)
        except KeyError:
            old = None
        doc.set(key, resume_from)
        changes[key] = (old, resume_from)
    text = doc.dump() if changes else doc.text
    copy.write_text(text, encoding="utf-8")
    return ConfigCopy(
        source=str(command.config_file),
        path=str(copy),
        changes=changes,
        diff=unified_diff(doc.text, text, str(command.config_file), str(copy)),
    )


def _builtins(spec: RunSpec, run_id: str, run_dir: Path, attempt: int) -> dict[str, Any]:
    """The built-in placeholders of an attempt, `resume_from` still empty."""
    assert spec.command is not None
    folder = attempt_dir(run_dir, attempt)
    config = spec.command.config_file
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "attempt": attempt,
        "events_file": str(folder / "events.jsonl"),
        "config_file": str(folder / config.name) if config is not None else "",
        "resume_from": "",
        "python": sys.executable,
    }


def with_bound_flags(spec: RunSpec, knobs: dict[str, Any]) -> list[str]:
    """The command's argv (placeholders still in) with each `flag` binding's flag and knob added
    where the knob differs from the program's default: before a preset's resume flag when argv
    ends with one, else at the end."""
    assert spec.command is not None
    argv = list(spec.command.argv)
    added: list[str] = []
    for name, binding in spec.command.bind.items():
        if binding.flag is not None and env_text(knobs[name]) != env_text(binding.default):
            added += [binding.flag, f"{{{name}}}"]
    at = len(argv) - 2 if len(argv) >= 2 and argv[-1] == "{resume_from?}" else len(argv)
    return [*argv[:at], *added, *argv[at:]]


def prepare_attempt(spec: RunSpec, run_id: str, run_dir: Path, attempt: int) -> PreparedAttempt:
    """Everything attempt `attempt` of a command run starts with; its record is written."""
    command = spec.command
    if command is None:
        raise ValueError("prepare_attempt is for command runs")
    now = time.time()
    cwd = command.cwd or run_dir
    folder = attempt_dir(run_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    builtins = _builtins(spec, run_id, run_dir, attempt)
    events_file = Path(builtins["events_file"])
    copy = Path(builtins["config_file"]) if command.config_file is not None else None
    since = _first_started(run_dir, attempt, now)
    found = _find_resume(spec, template_values(spec, builtins), run_dir, attempt, cwd, since)
    builtins["resume_from"] = str(found.path) if found is not None else ""
    values = template_values(spec, builtins)
    knobs = {name: values[name] for name in spec.knobs}  # text values with built-ins filled in
    resume_from = str(builtins["resume_from"])
    config = _config_copy(spec, knobs, copy, resume_from) if copy is not None else None
    argv = render_argv(with_bound_flags(spec, knobs), values)
    env = {name: render(value, values, f"command.env.{name}") for name, value in command.env.items()}
    bound = {b.env: env_text(knobs[n]) for n, b in command.bind.items() if b.env is not None}
    env.update(bound)
    env.update(
        {
            ENV_EVENTS_FILE: str(events_file),
            ENV_RUN_ID: run_id,
            ENV_ATTEMPT: str(attempt),
            ENV_RESUME_FROM: resume_from,
        }
    )
    scratch = _scratch_note(spec, values, attempt, cwd, since) if attempt > 1 and found is None else ""
    note = _resume_note(spec, attempt, found, scratch)
    moved = set_aside_note(set_aside(spec, values, argv, cwd, run_dir, attempt, since), attempt)
    note = "; ".join(part for part in (note, moved) if part)
    # Found is not handed over: a checkpoint the command passes nowhere is not the attempt's resume
    # point (its variable stays set: a script that asks sdk.resume_from() says so itself).
    handed = resume_from if passes_resume(command, spec.knobs) else ""
    warning = counter_warning(spec, run_dir, attempt, found, knobs) if found and handed else None
    record = AttemptRecord(
        prepared_at=now,
        argv=argv,
        cwd=str(cwd),
        knobs=knobs,
        env=bound,
        config=config,
        resume_from=handed or None,
        resume_note=note or None,
    )
    write_record(run_dir, attempt, record)
    if config is not None and config.changes:
        changed = changes_text(config.changes)
        note = f"{note}; config copy: {changed}" if note else f"config copy: {changed}"
    return PreparedAttempt(argv, env, cwd, record, note, warning or "")
