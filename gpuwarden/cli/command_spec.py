"""`gpuwarden run [OPTIONS] -- CMD ARGS…`: the spec of a command run, built from flags.

The flags build exactly what a spec file would say (`--print-spec` prints it), so a user can
start from the command line and keep the spec once it works.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuwarden.core.config.argv_flags import override_setting, setting_name, valued_flags
from gpuwarden.core.errors import ConfigError, UserError

if TYPE_CHECKING:
    from gpuwarden.core.config.spec import RunSpec

F = TypeVar("F", bound=Callable[..., Any])

# The spec's `command.roles` fields, kept here by name: the CLI does not import the spec's models
# to start (a test holds the two equal).
_ROLES = (
    "micro_batch",
    "eval_batch",
    "accum_steps",
    "world_size",
    "max_length",
    "max_pixels",
    "max_new_tokens",
    "gradient_checkpointing",
    "precision",
    "max_steps",
    "output_dir",
)


def command_options(fn: F) -> F:
    """The options that build a command run's spec."""
    options = [
        click.option("--name", help="Run name (default: the script's name)."),
        click.option("--gpus", help="How many GPUs, or their indices/UUIDs: 1, 0, '0,1' (default 1)."),
        click.option("--policy", help="Retune policy after an OOM: a name or a .yaml path."),
        click.option("--memory-limit", help="Address-space limit of the process, e.g. 6GiB."),
        click.option(
            "--knob", "knobs", multiple=True, metavar="NAME=VALUE", help="A knob and its value (repeatable)."
        ),
        click.option(
            "--bind",
            "binds",
            multiple=True,
            metavar="NAME=config:KEY|env:VAR",
            help="Where a knob lives: a key of --config-file, or a variable (repeatable).",
        ),
        click.option(
            "--role",
            "roles",
            multiple=True,
            metavar="ROLE=KNOB|KEY",
            help=f"Which knob, flag, config key or variable plays a role: {', '.join(_ROLES)} (repeatable).",
        ),
        click.option(
            "--config-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Your program's own YAML/JSON/TOML config: each attempt gets a copy with knobs applied.",
        ),
        click.option(
            "--checkpoints",
            metavar="GLOB",
            help="Where your program writes its checkpoints, e.g. 'ckpt/step-*': a restart passes the "
            "newest as {resume_from}.",
        ),
        click.option(
            "--framework",
            type=click.Choice(["none", "transformers", "accelerate", "lightning"]),
            help="Known flag names and checkpoints: Trainer's TrainingArguments, a loop of your own on "
            "Accelerate (as the *_no_trainer.py examples: step_N folders), Lightning's Trainer.",
        ),
        click.option("--env", "envs", multiple=True, metavar="NAME=VALUE", help="An environment variable."),
        click.option(
            "--warm-restart",
            is_flag=True,
            help="Keep the next attempt's interpreter waiting beside each attempt, the script's "
            "libraries imported (default: where the machine has 4 CPUs or more).",
        ),
        click.option(
            "--cold-restart",
            is_flag=True,
            help="Restart only in a fresh interpreter (no second one beside each attempt).",
        ),
        click.option("--print-spec", is_flag=True, help="Print the spec the flags build; submit nothing."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


FLAGS_LABEL = "the flags"
# The spec keys a flag sets: a problem with one is said in the flag's name, as the user typed it.
_FLAG_OF_KEY = {
    "name": "--name",
    "resources.gpus": "--gpus",
    "policy": "--policy",
    "resources.memory_limit": "--memory-limit",
    "command.config_file": "--config-file",
    "command.checkpoints.glob": "--checkpoints",
    "command.framework": "--framework",
}


def flags_spec(document: dict[str, Any]) -> RunSpec:
    """The spec the flags build, validated: a problem with a key a flag set names the flag."""
    from gpuwarden.core.config.spec import spec_from_mapping

    try:
        return spec_from_mapping(document, label=FLAGS_LABEL)
    except ConfigError as exc:
        raise ConfigError([in_flag_words(problem, FLAGS_LABEL) for problem in exc.problems]) from None


def in_flag_words(message: str, label: str) -> str:
    """`LABEL: resources.memory_limit: '' is not a size …` → `--memory-limit: '' is not …`, line by
    line (the daemon's answer to a submit of the flags' spec says `spec:`)."""
    return "\n".join(_line_in_flag_words(line, label) for line in message.split("\n"))


def _line_in_flag_words(problem: str, label: str) -> str:
    key, sep, rest = problem.removeprefix(f"{label}: ").partition(": ")
    if problem.startswith(f"{label}: ") and sep and key in _FLAG_OF_KEY:
        return f"{_FLAG_OF_KEY[key]}: {rest}"
    return problem


def flags_given(flags: dict[str, Any]) -> bool:
    return any(v not in (None, (), False) for v in flags.values())


def _pairs(items: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"{flag} {item!r}: write it as NAME=VALUE")
        out.append((name.strip(), value))
    return out


def _value(text: str) -> int | float | bool | str:
    from gpuwarden.core.command.presets import parse_value

    return parse_value(text)


def _default_name(argv: list[str]) -> str:
    script = next((Path(a).stem for a in argv if a.endswith(".py")), Path(argv[0]).name)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", script).strip("-._") or "command"
    return name[:64]


def _gpus(text: str | None) -> int | list[str]:
    if text is None:
        return 1
    if text.isdigit():
        return int(text)
    return [g.strip() for g in text.split(",") if g.strip()]


def _no_knob(flag: str, target: str, overrides: bool) -> str:
    """The fix for a role naming nothing, in the flags' words (the spec's are `knobs:`)."""
    if "." in target and overrides:
        return (
            f"{flag}: {target!r} is not in the command — add {target}=VALUE (the value it has now) "
            "beside the command's other overrides, or --config-file FILE where the key lives"
        )
    if "." in target:
        return (
            f"{flag}: {target!r} looks like a config key, but no --config-file names the file — add "
            "--config-file FILE, or give a knob (--knob NAME=VALUE) and write {NAME} in the command"
        )
    # The flag as the user spelled it: a script of `--gradient_accumulation_steps` is not told to
    # add `--gradient-accumulation-steps`, which its parser would refuse.
    option = f"--{target.lstrip('-')}"
    from gpuwarden.core.config.spec_command import ENV_NAME_RE

    if ENV_NAME_RE.fullmatch(target) and target.isupper():
        return (
            f"{flag}: no knob {target!r}, no {option} VALUE in the command and no variable {target} "
            f"set — give the variable its value (--env {target}=N, the value the program uses now), or "
            "name a flag the command passes"
        )
    return (
        f"{flag}: no knob {target!r} and no {option} VALUE in the command — add {option} N (the value "
        f"the program uses now) to the command, name a flag it passes, or give a knob (--knob "
        f"{target}=VALUE) and write {{{target}}} in the command"
    )


def _names_a_variable(
    target: str, variables: Mapping[str, str], config_file: Path | None, name_re: re.Pattern[str]
) -> bool:
    """A role naming a variable the run gets. With a config file, a lower-case name is its key."""
    if target not in variables or not name_re.fullmatch(target):
        return False
    return config_file is None or target.isupper()


def _binds(binds: tuple[str, ...], knob_names: set[str], preset: bool) -> dict[str, Any]:
    """`--bind NAME=config:KEY|env:VAR` as the spec's `command.bind`."""
    bind: dict[str, Any] = {}
    for name, where in _pairs(binds, "--bind"):
        kind, _, target = where.partition(":")
        if kind not in ("config", "env") or not target:
            raise UserError(f"--bind {name}={where}: write config:KEY or env:VARIABLE")
        if kind == "env" and name not in knob_names and not preset:
            raise UserError(f"--bind {name}={where}: give the knob its value too (--knob {name}=VALUE)")
        bind[name] = {kind: target}
    return bind


def _roles_and_binds(
    roles: tuple[str, ...],
    binds: tuple[str, ...],
    config_file: Path | None,
    knob_names: set[str],
    preset: bool,
    flags: set[str],
    overrides: bool,
    variables: Mapping[str, str],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The roles and bindings the flags ask for, and the knobs a role naming a variable adds."""
    # the spec models: `run`'s, not `ps`'s
    from gpuwarden.core.config.spec_command import ENV_NAME_RE, KEY_PATH_RE

    bind = _binds(binds, knob_names, preset)
    role_map: dict[str, Any] = {}
    added: dict[str, Any] = {}
    for role, target in _pairs(roles, "--role"):
        if role not in _ROLES:
            raise UserError(f"--role {role}: unknown role — one of {', '.join(_ROLES)}")
        # A knob or a flag (`batch_size`), or a config key (`training.batch_size`).
        if not KEY_PATH_RE.fullmatch(setting_name(target)):
            raise UserError(
                f"--role {role}={target}: name a knob, a flag of the command or a config key "
                f"(e.g. --role {role}=batch-size with --batch-size 32 in the command)"
            )
        if role == "world_size" and target.isdigit():
            role_map[role] = int(target)
        elif target in bind or target in knob_names or preset or setting_name(target) in flags:
            role_map[role] = target  # a flag of the command becomes its knob (as a preset's do)
        elif _names_a_variable(target, variables, config_file, ENV_NAME_RE):
            # `BATCH_SIZE=64 python train.py`: a knob bound to the variable carries the role.
            knob = target.lower() if target.lower() not in knob_names else target
            bind[knob] = {"env": target}
            added[knob] = _value(variables[target])
            role_map[role] = knob
        elif config_file is None:
            raise UserError(_no_knob(f"--role {role}={target}", target, overrides))
        else:
            # A key of the config file: a knob named after the key's last part carries it.
            knob = target.rsplit(".", 1)[-1]
            bind.setdefault(knob, {"config": target})
            role_map[role] = knob
    return role_map, bind, added


def _roles_binds_and_knobs(
    roles: tuple[str, ...],
    binds: tuple[str, ...],
    config: Path | None,
    knob_values: dict[str, Any],
    preset: bool,
    flags: set[str],
    overrides: bool,
    variables: dict[str, str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The roles and bindings; `knob_values` gains the knobs of roles naming a variable, and
    `variables` (the --env ones) loses those variables: each attempt gets its knob's value."""
    # The run gets this shell's environment: a role may name a variable set there or by --env.
    role_map, bind, added = _roles_and_binds(
        roles, binds, config, set(knob_values), preset, flags, overrides, {**os.environ, **variables}
    )
    knob_values.update(added)
    for binding in bind.values():
        variables.pop(binding.get("env", ""), None)
    return role_map, bind


def command_document(
    argv: list[str],
    cwd: Path,
    *,
    name: str | None,
    gpus: str | None,
    policy: str | None,
    memory_limit: str | None,
    knobs: tuple[str, ...],
    binds: tuple[str, ...],
    roles: tuple[str, ...],
    config_file: Path | None,
    checkpoints: str | None,
    framework: str | None,
    envs: tuple[str, ...],
    print_spec: bool,
    warm_restart: bool = False,
    cold_restart: bool = False,
) -> dict[str, Any]:
    """The spec document of `gpuwarden run [flags] -- argv`, with paths made absolute."""
    config = (cwd / config_file).absolute() if config_file is not None else None
    knob_values = {k: _value(v) for k, v in _pairs(knobs, "--knob")}
    preset = framework not in (None, "none")
    overrides = any(override_setting(item) for item in argv[1:])  # Hydra's `key=value`
    variables = dict(_pairs(envs, "--env"))
    role_map, bind = _roles_binds_and_knobs(
        roles, binds, config, knob_values, preset, valued_flags(argv), overrides, variables
    )
    command: dict[str, Any] = {"argv": argv, "cwd": str(cwd.absolute())}
    if config is not None:
        command["config_file"] = str(config)
    if framework:
        command["framework"] = framework
    if checkpoints is not None:
        command["checkpoints"] = {"glob": checkpoints}
    if bind:
        command["bind"] = bind
    if role_map:
        command["roles"] = role_map
    command.update(_restart_start(warm_restart, cold_restart))
    doc: dict[str, Any] = {
        "name": _default_name(argv) if name is None else name,
        "kind": "command",
        "command": command,
        "knobs": knob_values,
        "resources": {"gpus": _gpus(gpus)},
    }
    # An empty value (`--memory-limit "$LIMIT"` with LIMIT unset) is refused by the spec's checks,
    # never taken as the option left out.
    if memory_limit is not None:
        doc["resources"]["memory_limit"] = memory_limit
    if policy is not None:
        doc["policy"] = policy
    if variables:
        doc["env"] = variables
    return doc


def _restart_start(warm: bool, cold: bool) -> dict[str, bool]:
    """`command.warm_restart` as --warm-restart or --cold-restart set it (nothing: auto)."""
    if warm and cold:
        raise UserError("--warm-restart and --cold-restart: give one of them")
    return {"warm_restart": warm} if warm or cold else {}


def completed_document(document: dict[str, Any]) -> dict[str, Any]:
    """The completed spec (what the daemon would run: preset knobs, config values), defaults left out."""
    from gpuwarden.core.command.complete import complete_command

    spec = complete_command(flags_spec(document))
    data = spec.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    return {"version": 1, "name": spec.name, "kind": spec.kind, **data}


def printable_spec(document: dict[str, Any]) -> str:
    """The completed spec as YAML, its sizes written as a person writes them (`1300MiB`, not
    1363148800: what `--memory-limit 1300MiB` gave)."""
    import yaml

    completed = completed_document(document)
    resources = completed.get("resources")
    if isinstance(resources, dict):
        for key in ("memory_limit", "min_free_memory"):
            if isinstance(resources.get(key), int):
                resources[key] = written_size(resources[key])
    return yaml.safe_dump(completed, sort_keys=False, allow_unicode=True)


_UNITS = (
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("GB", 10**9),
    ("MB", 10**6),
)


def written_size(count: int) -> str | int:
    """`count` bytes in the largest unit that holds it whole (`6GiB`, `1500MB`); else the count."""
    for unit, factor in _UNITS:
        if count >= factor and count % factor == 0:
            return f"{count // factor}{unit}"
    return count
