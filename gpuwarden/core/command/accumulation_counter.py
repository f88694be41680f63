"""An Accelerate loop resumed with another accumulation than the checkpoint was written with.

`accelerator.save_state` stores the Accelerator's micro-batch counter (`accelerator.step`, the
micro-batches since the epoch began) and `load_state` restores it. The counter decides which
micro-batch ends an accumulation window (`step % gradient_accumulation_steps == 0`). Saved at
step 3 with accumulation 1 and resumed with accumulation 2, the first window after the resume
holds one micro-batch instead of two, every later window is shifted by one, and the loop's own
step count reaches its end a micro-batch early: the run trains on other batches than an
uninterrupted one. A script that sets `accelerator.step = 0` after `load_state` (the checkpoint
was written at a window's end) resumes exactly. The counter restarts at every epoch's end, so an
`epoch_N` checkpoint is never affected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.core.command.checkpoints import FoundCheckpoint
from gpuwarden.core.command.record import read_record
from gpuwarden.core.config.spec import RunSpec


def _writer_knobs(run_dir: Path, attempt: int, found: FoundCheckpoint) -> dict[str, Any] | None:
    """The knobs of the attempt that wrote `found`: the last one prepared before it was."""
    for number in range(attempt - 1, 0, -1):
        record = read_record(run_dir, number)
        if record is not None and record.prepared_at <= found.mtime:
            return record.knobs
    return None


def counter_warning(
    spec: RunSpec, run_dir: Path, attempt: int, found: FoundCheckpoint, knobs: dict[str, Any]
) -> str | None:
    """The `inexact_resume` warning when attempt `attempt` of an Accelerate loop resumes from a
    `step_N` folder with another accumulation than the attempt that wrote it; else None."""
    command = spec.command
    if command is None or command.framework != "accelerate" or not found.path.name.startswith("step_"):
        return None
    knob = command.roles.accum_steps
    writer = _writer_knobs(run_dir, attempt, found)
    if not isinstance(knob, str) or writer is None or str(writer.get(knob)) == str(knobs.get(knob)):
        return None
    return (
        f"resumed from {found.path.name} with accumulation {knobs.get(knob)}, written with "
        f"{writer.get(knob)}: Accelerate restores its micro-batch counter from the checkpoint, so the "
        "accumulation windows after the resume are shifted and the run differs from an uninterrupted "
        "one — unless the script sets accelerator.step = 0 after accelerator.load_state"
    )
