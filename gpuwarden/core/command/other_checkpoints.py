"""Checkpoints a run wrote where its spec does not look, in a layout another preset knows.

A training loop on Accelerate takes the Trainer's flag names (`--per_device_train_batch_size`,
`--output_dir`, `--resume_from_checkpoint`), so it is easily submitted as `--framework
transformers`: every restart then looks for `checkpoint-*` folders while the script writes
`step_N`, and starts from the beginning with its checkpoints beside it. When a restart finds
nothing, the folders the program writes to are searched (their entries only, never deeper) for a
checkpoint of a known layout written since the run began, and the attempt's line names it and the
preset that resumes from it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.command.checkpoints import MTIME_SLACK_S

# The file a framework writes last into each checkpoint folder, what the folder is, its preset.
LAYOUTS = (
    ("random_states_0.pkl", "an Accelerate checkpoint (accelerator.save_state)", "accelerate"),
    ("trainer_state.json", "a Trainer checkpoint", "transformers"),
)
# A folder of many thousand entries (a dataset beside the script) is not read to the end.
MAX_ENTRIES = 2000


@dataclass(frozen=True)
class OtherCheckpoint:
    path: Path
    what: str
    framework: str


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return [entry for entry in itertools.islice(found, MAX_ENTRIES) if entry.is_dir()]
    except OSError:
        return []


def _written_since(path: Path, earliest: float) -> float | None:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    return mtime if mtime >= earliest else None


def other_checkpoint(folders: list[Path], framework: str, since: float) -> OtherCheckpoint | None:
    """The newest checkpoint in `folders` of a layout whose preset is not `framework`, written
    since `since` (the run's first attempt), or None."""
    best: tuple[float, OtherCheckpoint] | None = None
    for folder in dict.fromkeys(folders):
        for entry in _entries(folder):
            for marker, what, preset in LAYOUTS:
                if preset == framework:
                    continue
                mtime = _written_since(Path(entry.path) / marker, since - MTIME_SLACK_S)
                if mtime is not None and (best is None or mtime > best[0]):
                    best = (mtime, OtherCheckpoint(Path(entry.path), what, preset))
    return best[1] if best is not None else None


def other_checkpoint_note(attempt: int, pattern: str | None, found: OtherCheckpoint) -> str:
    """The attempt's line: where the spec looked, what was found instead, the fix."""
    looked = (
        f"no complete checkpoint where the spec looks ({pattern})"
        if pattern
        else "the spec names no checkpoints"
    )
    return (
        f"attempt {attempt} starts from scratch: {looked}, but {found.path} is "
        f"{found.what} this run wrote — submit with --framework {found.framework} (framework: "
        f"{found.framework}) so that a restart resumes from it"
    )
