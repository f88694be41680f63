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
INEXACT_CODE = "inexact_resume"


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
    warnings: dict[int, str]  # why the resume differs from an uninterrupted run

    def of(self, attempt: int, record: AttemptRecord | None) -> dict[str, str | None]:
        """The attempt's `resumed_from` and `resume_warning`: the program's own word first, since
        only it knows what it loaded; else what its command was handed."""
        handed = record.resume_from if record is not None else None
        return {
            "resumed_from": self.reported.get(attempt, handed),
            "resume_warning": self.warnings.get(attempt),
        }


def resume_facts(events: Iterable[Mapping[str, Any]]) -> ResumeFacts:
    """From a run's `started` and `warning` events (any others are passed over)."""
    reported: dict[int, str] = {}
    warnings: dict[int, str] = {}
    for event in events:
        attempt, kind = event.get("attempt"), event.get("type")
        if not isinstance(attempt, int):
            continue
        loaded = event.get("resumed_from")
        from_program = event.get("source", "runner") == "runner"
        if kind == "started" and from_program and isinstance(loaded, str) and loaded:
            reported[attempt] = loaded
        message = event.get("message")
        if kind == "warning" and event.get("code") == INEXACT_CODE and isinstance(message, str):
            warnings.setdefault(attempt, message)
    return ResumeFacts(reported, warnings)


# Lightning (loops/training_epoch_loop.py, both package names) warns so when it restores a
# checkpoint saved inside an epoch and the dataloader keeps no state of its own: the epoch's
# batches come again from its first, so the run sees other data than an uninterrupted one would.
_MID_EPOCH_SIGNS = (b"resuming from a checkpoint that ended before the epoch ended",)
INEXACT_MESSAGE = (
    "resumed mid-epoch: the data order restarts — not the same as an uninterrupted run; checkpoint "
    "at an epoch's end, or make the dataloader resumable (state_dict / load_state_dict)"
)
LOG_HEAD_BYTES = 8 << 20
_CHUNK = 1 << 20


def inexact_resume(logs: Iterable[Path]) -> str | None:
    """The `inexact_resume` warning's message when one of an attempt's logs carries a framework's
    word that its resume was not exact; None otherwise. Only the head of each log is read: the
    framework says it while restoring, before the first batch, however long the attempt ran."""
    return INEXACT_MESSAGE if any(_head_says(path) for path in logs) else None


def _head_says(path: Path) -> bool:
    overlap = max(len(sign) for sign in _MID_EPOCH_SIGNS)
    carried = b""
    try:
        with path.open("rb") as fh:
            for _ in range(LOG_HEAD_BYTES // _CHUNK):
                chunk = fh.read(_CHUNK)
                if not chunk:
                    return False
                text = carried + chunk
                if any(sign in text for sign in _MID_EPOCH_SIGNS):
                    return True
                carried = text[-overlap:]  # a sign cut in two by the chunks' border
    except OSError:
        return False
    return False
