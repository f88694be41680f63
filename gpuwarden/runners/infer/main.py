"""Entry point of the inference runner: `run(spec, run_dir, attempt, events) -> exit status`.

`python -m gpuwarden.runners` calls `run` for `kind: infer`. Problems the user must fix (a missing
model directory, a missing input, 8-bit on a CPU, …) are raised as `UserError`, which the launcher
turns into an `error` event and exit status 2 without a traceback. Cheap checks come before
torch is imported, so a typo in a path is reported in about a second.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.errors import UserError
from gpuwarden.runners.events import EventWriter


def check_model_dir(path: Path) -> None:
    """A missing or incomplete model directory is the user's to fix: say which and how."""
    if not path.exists():
        raise UserError(
            f"model directory {path} does not exist — set infer.model to a local transformers model "
            "directory (one with config.json)",
            code="missing_model",
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise UserError(
            f"{path} is not a transformers model directory (no config.json) — point infer.model at "
            "the folder save_pretrained() wrote",
            code="missing_model",
        )


def check_input(infer: InferSpec) -> None:
    """The input must exist in the form the task reads: a file of prompts or a folder of images."""
    if infer.task == "generate" and not infer.input.is_file():
        raise UserError(
            f"input {infer.input} is not a file — task generate reads a JSONL file of prompts",
            code="bad_data",
        )
    if infer.task == "image_to_text" and not infer.input.is_dir():
        raise UserError(
            f"input {infer.input} is not a folder — task image_to_text reads a folder of images",
            code="bad_data",
        )


def run(spec: RunSpec, run_dir: Path, attempt: int, events: EventWriter) -> int:
    """Run one attempt of an inference run; returns an exit status from `gpuwarden.core.events`."""
    infer = spec.infer
    if infer is None:
        raise UserError("kind infer needs an `infer:` section", code="bad_input")
    check_model_dir(infer.model)
    check_input(infer)

    from gpuwarden.runners.infer.common import (
        check_eight_bit,
        make_context,
        quiet_transformers,
        warn_precision,
    )

    quiet_transformers()
    if infer.task == "generate":
        from gpuwarden.runners.infer.generate import output_path, run_generate

        output = output_path(infer.output, run_dir)
        ctx = make_context(spec, run_dir, attempt, events, output)
        check_eight_bit(infer, ctx.device)
        warn_precision(ctx)
        return run_generate(ctx, output)

    from gpuwarden.runners.infer.image_to_text import output_dir, run_image_to_text

    out_dir = output_dir(infer.output, run_dir)
    ctx = make_context(spec, run_dir, attempt, events, out_dir)
    check_eight_bit(infer, ctx.device)
    warn_precision(ctx)
    return run_image_to_text(ctx, out_dir)
