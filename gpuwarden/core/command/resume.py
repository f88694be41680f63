"""Whether a command run hands its program the checkpoint it restarts from.

A checkpoint found on disk is worth nothing to a program that is never given it: an attempt is
said to resume from one only when its command passes `{resume_from}` somewhere the program reads
(its argv, a variable of `command.env`, the key of its config copy, a knob that carries it there)
or when the program itself reports loading it (a `started` event with `resumed_from`, which
`sdk.resume_from()` and the Lightning callback write). Anything else starts from the beginning,
and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core.api.runs import AttemptRecord
from gpuwarden.core.command.presets import PRESETS
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.spec_command import CommandSpec
from gpuwarden.core.config.templating import placeholder_names

RESUME = "resume_from"
NOWHERE_CODE = "resume_nowhere"


def passes_resume(command: CommandSpec, knobs: Mapping[str, Any]) -> bool:
    """Whether `{resume_from}` reaches the program: directly in argv or command.env, through
    the config copy's checkpoint key, or inside the text of a knob that reaches it."""
    if command.checkpoints is not None and command.checkpoints.config_key and command.config_file:
        return True
    used: set[str] = set(command.bind)
    for text in [*command.argv, *command.env.values()]:
        used |= placeholder_names(text)
    if RESUME in used:
        return True
    return any(
        name in used and isinstance(value, str) and RESUME in placeholder_names(value)
        for name, value in knobs.items()
    )


def resume_flag_example(command: CommandSpec) -> str:
    """How this command would take the checkpoint: its preset's flag, else a plain `--resume`."""
    preset = PRESETS.get(command.framework)
    return f"{preset.resume_flag if preset is not None else '--resume'} {{resume_from?}}"


def nowhere_warning(spec: RunSpec) -> str | None:
    """The submit-time line for a spec that looks for checkpoints but hands them to nothing; None
    when it hands them over (or looks for none)."""
    command = spec.command
    if command is None or command.checkpoints is None or passes_resume(command, spec.knobs):
        return None
    return (
        "command.checkpoints is set but the command passes {resume_from} nowhere, so a restart "
        f"starts from the beginning — put it in the argv (e.g. {resume_flag_example(command)}), "
        "unless the script loads sdk.resume_from()"
    )


def unpassed_note(command: CommandSpec, attempt: int, path: Path, step: int | None, reported: bool) -> str:
    """The attempt's line when a checkpoint was found but its command passes it nowhere.
    `reported`: the program reported the checkpoint itself, so it speaks the SDK and may load it
    through sdk.resume_from() (it then says so, and that word replaces this line)."""
    at = f" (step {step})" if step is not None else ""
    unless = " unless it loads sdk.resume_from()" if reported else ""
    return (
        f"attempt {attempt} found {path}{at} but the command passes it nowhere — it starts from the "
        f"beginning{unless}; put {{resume_from}} in its argv, e.g. {resume_flag_example(command)}"
    )


@dataclass(frozen=True)
class ResumeFacts:
    """What a run's events say about each attempt's resume, by attempt number."""

    reported: dict[int, str]  # the checkpoint the program reported loading

    def of(self, attempt: int, record: AttemptRecord | None) -> dict[str, str | None]:
        """The attempt's `resumed_from`: the program's own word first, since only it knows what
        it loaded; else what its command was handed."""
        handed = record.resume_from if record is not None else None
        return {"resumed_from": self.reported.get(attempt, handed)}


def resume_facts(events: Iterable[Mapping[str, Any]]) -> ResumeFacts:
    """From a run's `started` events (any others are passed over)."""
    reported: dict[int, str] = {}
    for event in events:
        attempt, kind = event.get("attempt"), event.get("type")
        if not isinstance(attempt, int):
            continue
        loaded = event.get("resumed_from")
        from_program = event.get("source", "runner") == "runner"
        if kind == "started" and from_program and isinstance(loaded, str) and loaded:
            reported[attempt] = loaded
    return ResumeFacts(reported)
