"""Tuning a user's own program: the search of `tune`, on the knobs that play the roles.

The program keeps its effective batch (micro-batch × accumulation), so a tune needs both roles;
the learning rate is the program's own, so a tune that changed the effective batch could not
rescale it and is refused. Precision and compilation are the program's own settings too: only
the micro-batch (and with it the accumulation) is searched. The tuned values go under `knobs:`,
where they win over the flag or config-file value they replace.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.tune.command_probe import probe_blocker
from gpuwarden.core.tune.search import Candidate
from gpuwarden.core.tune.target import Target

NOTE = "a command run's precision and compilation are its own: only the micro-batch is searched"


def tune_blocker(spec: RunSpec) -> str | None:
    """Why a command run (completed with its preset) cannot be tuned, in one line; None if it can."""
    assert spec.command is not None
    blocker = probe_blocker(spec)
    if blocker is not None:
        return f"cannot probe this program — {blocker}"
    if "accum_steps" not in spec.command.roles.knob_names():
        return (
            "a tune keeps the effective batch, so it must know the accumulation knob — "
            "name it as command.roles.accum_steps"
        )
    return None


def setup_command_tune(
    spec: RunSpec, target: Target, *, change_effective_batch: bool, label: str
) -> tuple[RunSpec, Target]:
    """The completed spec (preset knobs, config values) and the target with only the micro-batch
    to search; one-line errors for what a tune of this program cannot do."""
    spec = complete_command(spec)
    blocker = tune_blocker(spec)
    if blocker is not None:
        raise UserError(f"{label}: {blocker}")
    if change_effective_batch:
        raise UserError(
            f"{label}: --change-effective-batch rescales the learning rate, which a command run's "
            "program sets itself — tune it without that option (the effective batch is kept)"
        )
    return spec, replace(target, precisions=[], compile_options=[], note=target.note or NOTE)


def command_start(spec: RunSpec) -> tuple[Candidate, int]:
    """The program's own micro-batch, accumulation and precision; the per-device batch to keep."""
    assert spec.command is not None
    roles = spec.command.roles.knob_names()
    micro = int(spec.knobs[roles["micro_batch"]])
    accum = int(spec.knobs[roles["accum_steps"]]) if "accum_steps" in roles else 1
    precision = str(spec.knobs[roles["precision"]]) if "precision" in roles else "auto"
    return Candidate(micro, accum, precision, False), micro * accum


def command_knobs(spec: RunSpec, c: Candidate) -> dict[str, Any]:
    """The knobs a tuned candidate sets, under the program's own knob names."""
    assert spec.command is not None
    roles = spec.command.roles.knob_names()
    knobs: dict[str, Any] = {roles["micro_batch"]: c.batch_size}
    if "accum_steps" in roles:
        knobs[roles["accum_steps"]] = c.grad_accum_steps
    return knobs


__all__ = ["NOTE", "command_knobs", "command_start", "setup_command_tune"]
