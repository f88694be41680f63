"""Are a spec's inputs where it says? Models, data and working directories checked before a run
is queued or probed, so a typo costs one line at submit time instead of a failed attempt later.

The runners check the same things again when they start (a file may vanish meanwhile); the
words here match theirs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError

# The folder `gpuwarden example-models` builds by default, which the shipped examples read from.
EXAMPLE_MODELS = ".example-models"


def _shown(path: Path) -> Path:
    """The path as a user reads it: `configs/examples/../../x` is `x` (only shown, never opened)."""
    return Path(os.path.normpath(path))


def _model_dir(path: Path, key: str) -> str | None:
    if not path.exists():
        return f"{key}: model directory {_shown(path)} does not exist"
    if not path.is_dir() or not (path / "config.json").is_file():
        return f"{key}: {_shown(path)} has no config.json (a directory save_pretrained() wrote)"
    return None


def missing_inputs(spec: RunSpec) -> list[str]:
    """One line per input the spec names that is not there (empty when all are)."""
    problems = [
        *_command_problems(spec),
        *_example_arguments(spec),
        *_train_problems(spec),
        *_infer_problems(spec),
    ]
    return [p for p in problems if p is not None]


def _command_problems(spec: RunSpec) -> list[str | None]:
    command = spec.command
    if command is None:
        return []
    if command.cwd is not None and not command.cwd.is_dir():
        return [f"command.cwd: directory {command.cwd} does not exist"]
    program = command.argv[0]
    if "/" not in program or "{" in program or Path(program).is_absolute():
        return [_python_script_problem(command.argv, command.cwd)]
    if command.cwd is None:
        # Sent without the folder it is relative to (a spec over the API without base_dir).
        where = "set command.cwd, or give an absolute path"
        return [f"command.argv[0]: {program} is relative to no folder ({where})"]
    if not (command.cwd / program).exists():
        return [f"command.argv[0]: {program} is not in {command.cwd}"]
    return [_python_script_problem(command.argv, command.cwd)]


# Python's options that take the next word as their value; `-c` and `-m` run no script file.
_PYTHON_VALUED = frozenset({"-X", "-W", "--check-hash-based-pycs"})
_PYTHON_NO_SCRIPT = frozenset({"-c", "-m", "-"})


def _python_script_problem(argv: list[str], cwd: Path | None) -> str | None:
    """`python [OPTIONS] SCRIPT …` whose script is not there: Python would say so only once the
    attempt starts (`can't open file`), a failed run where one line at submit does."""
    if cwd is None or not _is_python(argv[0]):
        return None
    words = iter(enumerate(argv[1:], start=1))
    for index, word in words:
        if word in _PYTHON_NO_SCRIPT or word.startswith(("-c", "-m")) or "{" in word:
            return None
        if word in _PYTHON_VALUED:
            next(words, None)
            continue
        if word.startswith("-"):
            continue
        if (cwd / word).exists():
            return None
        return f"command.argv[{index}]: the script {word} is not in {cwd}"
    return None


def _is_python(program: str) -> bool:
    """`python`, `python3`, `python3.11`, `/usr/bin/python3` … (not `pythonw` wrappers' cousins)."""
    name = Path(program).name
    return name == "python" or (name.startswith("python") and name[6:].replace(".", "").isdigit())


def _example_arguments(spec: RunSpec) -> list[str | None]:
    """A command's arguments that name something in an example-models folder (the shipped
    examples of users' own scripts pass their model this way): those, at least, are checked."""
    command = spec.command
    if command is None or command.cwd is None:
        return []
    problems: list[str | None] = []
    for index, word in enumerate(command.argv[1:], start=1):
        if "{" in word or EXAMPLE_MODELS not in Path(word).parts:
            continue
        path = command.cwd / word
        if not path.exists():
            problems.append(f"command.argv[{index}]: {_shown(path)} does not exist")
    return problems


def _train_problems(spec: RunSpec) -> list[str | None]:
    train = spec.train
    if train is None:
        return []
    if train.task != "causal_lm":
        if train.data is None or train.data.is_dir():
            return []
        return [
            f"train.data: {_shown(train.data)} is not a folder of images (leave it out for synthetic data)"
        ]
    problems: list[str | None] = []
    if train.model is not None:
        problems.append(_model_dir(train.model, "train.model"))
    if train.tokenizer is not None and not train.tokenizer.is_dir():
        problems.append(f"train.tokenizer: directory {_shown(train.tokenizer)} does not exist")
    if train.data is not None and not train.data.is_file():
        problems.append(
            f"train.data: {_shown(train.data)} is not a file (causal_lm reads JSON or JSONL texts)"
        )
    return problems


def _infer_problems(spec: RunSpec) -> list[str | None]:
    infer = spec.infer
    if infer is None:
        return []
    problems = [_model_dir(infer.model, "infer.model")]
    if infer.task == "generate" and not infer.input.is_file():
        problems.append(
            f"infer.input: {_shown(infer.input)} is not a file (generate reads a JSONL file of prompts)"
        )
    if infer.task == "image_to_text" and not infer.input.is_dir():
        problems.append(
            f"infer.input: {_shown(infer.input)} is not a folder (image_to_text reads a folder of images)"
        )
    return problems


def _inputs(spec: RunSpec) -> Iterator[Path]:
    """Every file or folder the spec names as an input (a command's arguments included)."""
    sections: list[object] = [spec.train, spec.infer]
    for section in sections:
        for name in ("model", "tokenizer", "data", "input"):
            value = getattr(section, name, None)
            if isinstance(value, Path):
                yield value
    if spec.command is not None and spec.command.cwd is not None:
        yield from (spec.command.cwd / word for word in spec.command.argv[1:] if "{" not in word)


def example_models_fix(spec: RunSpec) -> str | None:
    """The command that builds the missing inputs, when they are the shipped examples' models:
    a newcomer who skipped `gpuwarden example-models`, or ran it in another folder, needs that
    command, not "fix the path"."""
    for path in _inputs(spec):
        parts = path.parts
        if EXAMPLE_MODELS in parts and not path.exists():
            folder = _shown(Path(*parts[: parts.index(EXAMPLE_MODELS) + 1]))
            return f"build the example models first: gpuwarden example-models {folder}"
    return None


def require_inputs(spec: RunSpec, label: str, fix: str) -> None:
    """UserError (code missing_input) naming the first missing input, then `fix` (or the command
    that builds the examples' models, when those are what is missing)."""
    missing = missing_inputs(spec)
    if missing:
        fix = example_models_fix(spec) or fix
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{label}: {missing[0]}{more} — {fix}", code="missing_input")
