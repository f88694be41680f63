"""Submit time for a command run: the spec made whole, or one line saying what is wrong.

The framework preset turns known flags into knobs; knobs bound to config keys take their value
from the user's file when the spec gives none; argv must name the config copy; every
placeholder must be known; role knobs must hold values the retune maths can use. Running this
twice changes nothing, so the CLI's `--print-spec` and the daemon's submit agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.command.batch_finder import FINDER_CODE, batch_finder_warning
from gpuwarden.core.command.batch_hint import UNNAMED_CODE, unnamed_batch_warning
from gpuwarden.core.command.config_file import ConfigDocument, load_config
from gpuwarden.core.command.help_check import (
    HELP_TIMEOUT_S,
    FlagCheck,
    HelpAsk,
    HelpRunner,
    ask_resume_flag,
    check_resume_flag,
)
from gpuwarden.core.command.presets import apply_preset
from gpuwarden.core.command.resume import NOWHERE_CODE, nowhere_warning
from gpuwarden.core.config.excerpt import value_excerpt
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.config.spec_command import CONFIG_SUFFIXES, KnobBinding
from gpuwarden.core.config.templating import check_command, placeholder_names
from gpuwarden.core.errors import UserError

_INT_ROLES = (
    "micro_batch",
    "accum_steps",
    "world_size",
    "max_length",
    "max_pixels",
    "max_new_tokens",
    "max_steps",
)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def _switched_on(config: ConfigDocument, key: str) -> bool:
    try:
        value = config.get(key)
    except KeyError:
        return False
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _from_flags(name: str, binding: KnobBinding, config: ConfigDocument) -> Any:
    """The knob's value from its switches: the one switched on, else the binding's default."""
    assert binding.flags is not None
    on = [key for key in binding.flags if _switched_on(config, key)]
    if len(on) > 1:
        raise UserError(
            f"command.bind.{name}: {' and '.join(repr(k) for k in on)} are all true in {config.path} "
            "— switch one on at most"
        )
    if on:
        return binding.flags[on[0]]
    if binding.default is None:
        keys = ", ".join(repr(k) for k in binding.flags)
        raise UserError(
            f"command.bind.{name}: none of {keys} is true in {config.path} — give the knob's value "
            "for that case as `default:`"
        )
    return binding.default


def _fill_from_config(spec: RunSpec, config: ConfigDocument) -> RunSpec:
    assert spec.command is not None
    knobs = dict(spec.knobs)
    for name, binding in spec.command.bind.items():
        if binding.flags is not None and name not in knobs:
            knobs[name] = _from_flags(name, binding, config)
        if binding.config is None:
            continue
        try:
            value = config.get(binding.config)
        except KeyError:
            if name in knobs:
                continue  # the copy adds the key
            if binding.default is None:
                raise UserError(
                    f"command.bind.{name}: {config.path} has no key {binding.config!r} — fix the key "
                    f"path, or give the knob a value under `knobs:`"
                ) from None
            value = binding.default
        if not isinstance(value, bool | int | float | str):
            what = (
                "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else "empty"
            )
            raise UserError(
                f"command.bind.{name}: {binding.config!r} in {config.path} is {what}, not a single "
                "value — bind the knob to a key that holds one"
            )
        knobs.setdefault(name, value)
    return spec.model_copy(update={"knobs": knobs})


def _names_config_file(spec: RunSpec) -> RunSpec:
    """argv or command.env must pass the copy; an argv item that is the user's file itself becomes
    `{config_file}`."""
    command = spec.command
    assert command is not None and command.config_file is not None
    # A program may take its config path from a variable: `env: {CFG: "{config_file}"}`.
    if any("{config_file" in item for item in [*command.argv, *command.env.values()]):
        return spec
    target = os.path.realpath(command.config_file)
    base = command.cwd
    argv = list(command.argv)
    for i, item in enumerate(argv):
        prefix, sep, value = item.partition("=") if item.startswith("-") else ("", "", item)
        if not value or (base is None and not os.path.isabs(value)):
            continue
        candidate = Path(value) if os.path.isabs(value) else Path(base or "") / value
        if os.path.realpath(candidate) == target:
            argv[i] = f"{prefix}{sep}{{config_file}}"
            updated = command.model_copy(update={"argv": argv})
            return spec.model_copy(update={"command": updated})
    raise UserError(
        f"command.config_file is {command.config_file}, but neither argv nor command.env passes "
        f"it — put {{config_file}} where your program takes its config path (it gets the attempt's copy)"
    )


def _whole(value: Any, role: str) -> bool:
    """A whole number ≥ 1; `max_steps` may also be -1, the frameworks' "train by epochs"
    (LightningCLI's `--print_config` and the Trainer's defaults write it)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value >= 1 or (role == "max_steps" and value == -1)


def _check_roles(spec: RunSpec) -> None:
    assert spec.command is not None
    roles = spec.command.roles
    for role, name in roles.knob_names().items():
        if name not in spec.knobs and name not in spec.command.bind:
            # Only a preset run gets here: the spec's own check waits for the preset's knobs.
            raise UserError(
                f"command.roles.{role}: no knob {name!r} — the command has no --{name} flag for the "
                f"preset to take it from: add the flag with its value, or give the knob (--knob {name}=VALUE)"
            )
        value = spec.knobs.get(name)
        where = f"knobs.{name} (command.roles.{role}) is {value_excerpt(value)}"
        if role in _INT_ROLES and not _whole(value, role):
            no_limit = ", or -1 for no limit" if role == "max_steps" else ""
            raise UserError(f"{where}: a {role} must be a whole number ≥ 1{no_limit}")
        if role == "gradient_checkpointing" and not isinstance(value, bool):
            raise UserError(f"{where}: gradient_checkpointing must be true or false")
        if role == "precision" and value not in PRECISIONS:
            raise UserError(f"{where}: a precision knob holds one of {', '.join(PRECISIONS)}")


def _check_roles_reach(spec: RunSpec) -> None:
    """A role's knob must reach the program, or every retune of it changes nothing and the run
    fails the same way until the ladder gives up."""
    command = spec.command
    assert command is not None
    used: set[str] = set(command.bind)
    for text in [*command.argv, *command.env.values()]:
        used |= placeholder_names(text)
    for role, name in command.roles.knob_names().items():
        # Under torchrun the ranks learn the world size from torchrun itself.
        if name in used or (role == "world_size" and command.launcher == "torchrun"):
            continue
        raise UserError(
            f"command.roles.{role}: knob {name!r} reaches your program nowhere — write {{{name}}} "
            f"where the command takes it (e.g. --flag {{{name}}}), or bind it to a config key or variable"
        )


def _check_args_file(spec: RunSpec) -> None:
    """`python train.py args.json` under a framework preset: the batch size is in that file, which
    the preset reads only when it is named as the config file. Unnamed, the run would start
    with nothing to retune and a resume flag the program's args-file mode rejects."""
    command = spec.command
    assert command is not None
    if command.config_file is not None or "micro_batch" in command.roles.knob_names():
        return
    for before, item in zip(command.argv, command.argv[1:], strict=False):
        # A positional file (HfArgumentParser's one-argument idiom) or LightningCLI's --config.
        if before.startswith("-") and before not in ("--config", "-c"):
            continue
        path = Path(item) if os.path.isabs(item) or command.cwd is None else Path(command.cwd) / item
        if path.suffix.lower() in CONFIG_SUFFIXES and path.is_file():
            raise UserError(
                f"command.argv passes {item}, where {command.framework} settings such as the batch "
                f"size live — name it the config file too (--config-file {item}, or "
                "command.config_file) so each attempt gets a retuned copy"
            )


@dataclass(frozen=True)
class Submitted:
    """A command run's spec as a submit queues it, and the lines its user should read about it
    (code, message): warnings, not refusals."""

    spec: RunSpec
    warnings: list[tuple[str, str]] = field(default_factory=list)
    help: HelpAsk | None = None  # the script's help, left to read beside the first attempt


def complete_submitted(
    spec: RunSpec,
    environment: Mapping[str, str],
    *,
    help_timeout_s: float = HELP_TIMEOUT_S,
    help_runner: HelpRunner | None = None,
    defer_help: bool = False,
) -> Submitted:
    """`complete_command`, and what only a submit does: a preset's resume flag is asked of the
    script's own `--help` (run with `environment`; with `defer_help`, only said what to run, for
    the caller to read beside the first attempt), and a run that would restart from the
    beginning whatever it checkpointed is told so. The spec is checked first, so a spec that is
    refused anyway runs nothing."""
    completed = complete_command(spec)
    if spec.command is None:
        return Submitted(completed)
    # Said whatever the script's help says: it is read from the command alone.
    finder = [(FINDER_CODE, line)] if (line := batch_finder_warning(completed)) else []
    ask = ask_resume_flag(spec, environment)
    if isinstance(ask, HelpAsk) and defer_help:
        return Submitted(completed, finder, help=ask)
    if isinstance(ask, FlagCheck):
        checked = ask
    else:
        checked = check_resume_flag(spec, environment, help_runner, help_timeout_s)
    if checked.spec is not spec:
        completed = complete_command(checked.spec)
    if checked.lines():
        return Submitted(completed, [*checked.lines(), *finder])  # says it for the flag too
    said = [(NOWHERE_CODE, nowhere_warning(completed)), (UNNAMED_CODE, unnamed_batch_warning(completed))]
    return Submitted(completed, [(code, message) for code, message in said if message] + finder)


def _glob_follows_output_dir(spec: RunSpec) -> RunSpec:
    """A checkpoint pattern inside the folder the output_dir knob names follows the knob: a run
    again with another folder (or a probe, which points it elsewhere) looks where that one writes."""
    command = spec.command
    knob = command.roles.output_dir if command is not None else None
    value = spec.knobs.get(knob) if knob else None
    if command is None or command.checkpoints is None or not isinstance(value, str) or not value.strip("./"):
        return spec
    pattern, folder = command.checkpoints.glob, os.path.normpath(value)
    inside = os.path.normpath(pattern)
    if placeholder_names(pattern) or not (inside + "/").startswith(folder + "/"):
        return spec
    checkpoints = command.checkpoints.model_copy(update={"glob": f"{{{knob}}}{inside[len(folder) :]}"})
    return spec.model_copy(update={"command": command.model_copy(update={"checkpoints": checkpoints})})


def complete_command(spec: RunSpec) -> RunSpec:
    """The command run's spec with preset knobs and config values filled in, after every check
    that can be made before it runs (other kinds come back unchanged)."""
    command = spec.command
    if command is None:
        return spec
    config = load_config(command.config_file) if command.config_file is not None else None
    spec = apply_preset(spec, config)
    if command.framework != "none":
        _check_args_file(spec)
    if config is not None:
        spec = _fill_from_config(spec, config)
        spec = _names_config_file(spec)
    # After the config file's values: the output_dir knob may be a key of it.
    spec = _glob_follows_output_dir(spec)
    assert spec.command is not None
    unvalued = [n for n, b in spec.command.bind.items() if n not in spec.knobs]
    if unvalued:
        raise UserError(f"command.bind.{unvalued[0]}: give the knob a value under `knobs:`")
    check_command(spec)
    _check_roles(spec)
    _check_roles_reach(spec)
    # Re-validate the whole: the preset and the file's values went in after the first check.
    data: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    return spec_from_mapping(data)
