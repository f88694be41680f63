"""Are a spec's inputs where it says? Models, data and working directories checked before a run
is queued or probed, so a typo costs one line at submit time instead of a failed attempt later.

The runners check the same things again when they start (a file may vanish meanwhile); the
words here match theirs.
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError


def _model_dir(path: Path, key: str) -> str | None:
    if not path.exists():
        return f"{key}: model directory {path} does not exist"
    if not path.is_dir() or not (path / "config.json").is_file():
        return f"{key}: {path} has no config.json (a directory save_pretrained() wrote)"
    return None


def missing_inputs(spec: RunSpec) -> list[str]:
    """One line per input the spec names that is not there (empty when all are)."""
    problems = [*_command_problems(spec), *_train_problems(spec), *_infer_problems(spec)]
    return [p for p in problems if p is not None]


def _command_problems(spec: RunSpec) -> list[str | None]:
    command = spec.command
    if command is None:
        return []
    if command.cwd is not None and not command.cwd.is_dir():
        return [f"command.cwd: directory {command.cwd} does not exist"]
    program = command.argv[0]
    if "/" not in program or "{" in program or Path(program).is_absolute():
        return []  # looked up on PATH, filled in per attempt, or named whole
    if command.cwd is None:
        # Sent without the folder it is relative to (a spec over the API without base_dir).
        where = "set command.cwd, or give an absolute path"
        return [f"command.argv[0]: {program} is relative to no folder ({where})"]
    if not (command.cwd / program).exists():
        return [f"command.argv[0]: {program} is not in {command.cwd}"]
    return []


def _train_problems(spec: RunSpec) -> list[str | None]:
    train = spec.train
    if train is None:
        return []
    if train.task != "causal_lm":
        if train.data is None or train.data.is_dir():
            return []
        return [f"train.data: {train.data} is not a folder of images (leave it out for synthetic data)"]
    problems: list[str | None] = []
    if train.model is not None:
        problems.append(_model_dir(train.model, "train.model"))
    if train.tokenizer is not None and not train.tokenizer.is_dir():
        problems.append(f"train.tokenizer: directory {train.tokenizer} does not exist")
    if train.data is not None and not train.data.is_file():
        problems.append(f"train.data: {train.data} is not a file (causal_lm reads JSON or JSONL texts)")
    return problems


def _infer_problems(spec: RunSpec) -> list[str | None]:
    infer = spec.infer
    if infer is None:
        return []
    problems = [_model_dir(infer.model, "infer.model")]
    if infer.task == "generate" and not infer.input.is_file():
        problems.append(f"infer.input: {infer.input} is not a file (generate reads a JSONL file of prompts)")
    if infer.task == "image_to_text" and not infer.input.is_dir():
        problems.append(
            f"infer.input: {infer.input} is not a folder (image_to_text reads a folder of images)"
        )
    return problems


def require_inputs(spec: RunSpec, label: str, fix: str) -> None:
    """UserError (code missing_input) naming the first missing input, then `fix`."""
    missing = missing_inputs(spec)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{label}: {missing[0]}{more} — {fix}", code="missing_input")
