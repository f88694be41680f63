"""The `command:` section of a run spec: a user's own program and what gpuwarden may change in it.

A knob (`knobs:` at the top of the spec) reaches the program through `{name}` in argv, and also,
when `bind` says so, through a key of the program's own config file or an environment variable.
`roles` say which knobs make the effective batch (micro-batch × accumulation × world size) and
which other ones the retune ladder may change; `checkpoints` say where the program's own
checkpoints are, so a restart can pass the newest one as `{resume_from}`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuwarden.core.config.excerpt import value_excerpt
from gpuwarden.core.config.validation import StrictModel

KnobValue = int | float | str | bool
Framework = Literal["none", "transformers", "accelerate", "lightning"]
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A key path inside a config file: names separated by dots; digits index a list.
FLAG_RE = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]*")
KEY_PATH_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise ValueError(
                f"{value_excerpt(name)} is not a valid environment variable name — use letters, digits, _"
            )
        check_no_nul(value, name)
    return env


def check_no_nul(text: str, where: str) -> None:
    """A NUL cannot reach a program (execve ends each argument and variable at one): refused when
    the spec is read, not when an attempt cannot start."""
    if "\x00" in text:
        raise ValueError(f"{where}: holds a NUL character, which no program can be given — remove it")


class KnobBinding(StrictModel):
    """Where a knob lives besides `{name}` in argv: a key of the config file, or a variable."""

    config: str | None = Field(
        None, description="key path in command.config_file, e.g. training.batch_size (digits index lists)"
    )
    env: str | None = Field(None, description="environment variable that carries the value")
    flag: str | None = Field(
        None,
        description="a flag of the command that takes the value, passed only while the value differs "
        "from `default` (what the program does without the flag), e.g. --gradient_accumulation_steps",
    )
    flags: dict[str, KnobValue] | None = Field(
        None,
        description="config keys that are switches, each true when the knob holds its value and "
        "false otherwise, e.g. {bf16: bf16, fp16: fp16} for a precision knob",
    )
    default: KnobValue | None = Field(
        None,
        description="the value the program uses when the config file lacks the key (with `flags`: "
        "when none of the switches is true)",
    )

    @property
    def in_config(self) -> bool:
        """Whether the knob lives in the config file (a key, or switches)."""
        return self.config is not None or self.flags is not None

    @field_validator("config")
    @classmethod
    def _key_path(cls, v: str | None) -> str | None:
        if v is not None and not KEY_PATH_RE.match(v):
            raise ValueError(f"{value_excerpt(v)} is not a key path — write it like training.batch_size")
        return v

    @field_validator("env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not ENV_NAME_RE.fullmatch(v):
            raise ValueError(
                f"{value_excerpt(v)} is not a valid environment variable name — use letters, digits, _"
            )
        return v

    @field_validator("flags")
    @classmethod
    def _flag_keys(cls, v: dict[str, KnobValue] | None) -> dict[str, KnobValue] | None:
        if v is not None:
            if not v:
                raise ValueError("no switches — give them as {key.path: knob value}")
            bad = [key for key in v if not KEY_PATH_RE.match(key)]
            if bad:
                raise ValueError(f"{value_excerpt(bad[0])} is not a key path — write it like training.bf16")
        return v

    @field_validator("flag")
    @classmethod
    def _flag_name(cls, v: str | None) -> str | None:
        if v is not None and not FLAG_RE.fullmatch(v):
            raise ValueError(
                f"{value_excerpt(v)} is not a flag — write it like --gradient_accumulation_steps"
            )
        return v

    @model_validator(mode="after")
    def _one_place(self) -> KnobBinding:
        if sum(x is not None for x in (self.config, self.env, self.flag, self.flags)) != 1:
            raise ValueError(
                "give exactly one of `config: key.path`, `env: VARIABLE`, `flag: --name`, "
                "`flags: {key: value}`"
            )
        if self.flag is not None and self.default is None:
            raise ValueError("a `flag` binding needs `default`: the value the program has without the flag")
        if self.default is not None and not self.in_config and self.flag is None:
            raise ValueError("`default` is for config keys (the value used when the file lacks the key)")
        return self


class Roles(StrictModel):
    """Which knob plays which part. Each value names a knob (`world_size` may be a number)."""

    micro_batch: str | None = Field(None, description="the knob that is the per-device micro-batch")
    eval_batch: str | None = Field(
        None, description="the evaluation's batch, where it has its own: lowered when evaluation runs out"
    )
    accum_steps: str | None = Field(None, description="gradient accumulation steps")
    world_size: str | int | None = Field(None, description="processes (a knob, or a number; default 1)")
    max_length: str | None = Field(None, description="sequence length (lowered only when allowed)")
    max_pixels: str | None = None
    max_new_tokens: str | None = None
    gradient_checkpointing: str | None = Field(None, description="a true/false knob")
    precision: str | None = Field(None, description="a knob whose values are fp32, bf16 or fp16")
    max_steps: str | None = Field(None, description="optimizer steps: probes set it small")
    output_dir: str | None = Field(None, description="where the program writes: probes point it elsewhere")

    @field_validator("world_size")
    @classmethod
    def _world(cls, v: str | int | None) -> str | int | None:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be ≥ 1")
        return v

    @model_validator(mode="after")
    def _one_knob_one_role(self) -> Roles:
        seen: dict[str, str] = {}
        for role, name in self.knob_names().items():
            if name in seen:
                raise ValueError(
                    f"{seen[name]} and {role} both name {name!r} — each role changes its own knob: "
                    "give each one its own"
                )
            seen[name] = role
        return self

    def knob_names(self) -> dict[str, str]:
        """Role → knob name, for the roles that name a knob."""
        return {role: v for role, v in self.model_dump().items() if isinstance(v, str)}


def _searches_everything(pattern: str) -> str | None:
    """`the whole file system` for `/**/x`, `your whole home folder` for `~/**/x`: a recursive
    pattern whose fixed start is the root or the home folder; None otherwise."""
    parts = pattern.split("/")
    if "**" not in parts:
        return None
    fixed = list(itertools.takewhile(lambda part: not any(c in part for c in "*?["), parts))
    if fixed == [""]:
        return "the whole file system"
    if fixed in (["~"], ["", "home"], ["", "root"]) or (fixed[:1] == ["~"] and fixed[1:] == [""]):
        return "your whole home folder" if fixed[0] == "~" else f"every folder under {'/'.join(fixed)}"
    return None


class Checkpoints(StrictModel):
    """Where the program's own checkpoints are, when it does not report them as events."""

    glob: str = Field(description="pattern relative to the working directory, e.g. outputs/checkpoint-*")
    complete_when: str | None = Field(
        None, description="a file inside a checkpoint folder that exists only once it is complete"
    )
    config_key: str | None = Field(
        None, description="key of the config file that receives the checkpoint to resume from"
    )

    @field_validator("glob")
    @classmethod
    def _relative(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("an empty pattern matches nothing — e.g. outputs/checkpoint-*")
        whole = _searches_everything(v)
        if whole is not None:
            # Searched at every restart: a walk of every folder there could hold the daemon for minutes.
            raise ValueError(
                f"{value_excerpt(v)} searches {whole} at every restart — start it in the folder the "
                "program writes to (e.g. /data/my-run/**/*.pt)"
            )
        return v

    @field_validator("config_key")
    @classmethod
    def _key_path(cls, v: str | None) -> str | None:
        if v is not None and not KEY_PATH_RE.match(v):
            raise ValueError(f"{value_excerpt(v)} is not a key path — write it like training.resume_from")
        return v


class CommandSpec(StrictModel):
    """A program to run as-is: an argv list (no shell), extra environment, working directory."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = Field(
        None,
        description="working directory (default: the spec file's folder; without one, the run's)",
    )
    launcher: Literal["none", "torchrun"] = Field(
        "none", description="torchrun: start one process per GPU through torch.distributed.run"
    )
    config_file: Path | None = Field(
        None,
        description="the program's own YAML, JSON or TOML config: each attempt gets a copy with the "
        "knobs' keys changed, named by {config_file} in argv; the file itself is never modified",
    )
    framework: Framework = Field(
        "none",
        description="transformers, accelerate (a loop of your own on Accelerate, as the *_no_trainer.py "
        "examples) or lightning: their flag and key names and checkpoint folders are known",
    )
    bind: dict[str, KnobBinding] = Field(
        default_factory=dict, description="knob → config key or environment variable"
    )
    roles: Roles = Field(default_factory=Roles)
    checkpoints: Checkpoints | None = None
    resume_flag: bool = Field(
        True,
        description="false: the framework preset adds no resume flag (the program takes its checkpoint "
        "another way, e.g. sdk.resume_from()); set at submit when the script's --help does not list the flag",
    )
    warm_restart: Literal["auto"] | bool = Field(
        "auto",
        description="true: a Python script's next attempt waits beside each attempt with the script's "
        "libraries imported, so a restart skips importing them; false: never (it holds host memory); "
        "auto: where the machine has 4 CPUs or more (on fewer, the imports slow the running attempt)",
    )

    @field_validator("argv")
    @classmethod
    def _argv_not_blank(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (argv[0]) is empty — name the program to run")
        for i, item in enumerate(v):
            check_no_nul(item, f"argv[{i}]")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env_names(v)

    @field_validator("config_file")
    @classmethod
    def _config_suffix(cls, v: Path | None) -> Path | None:
        if v is not None and v.suffix.lower() not in CONFIG_SUFFIXES:
            raise ValueError(f"{v.name}: config files are .yaml, .yml, .json or .toml")
        return v

    @model_validator(mode="after")
    def _bindings_need_a_file(self) -> CommandSpec:
        keyed = [name for name, b in self.bind.items() if b.in_config]
        if keyed and self.config_file is None:
            raise ValueError(
                f"bind.{keyed[0]} names a config key, but command.config_file is not set"
                " — name the file (command.config_file, or --config-file FILE on the command line)"
            )
        if self.checkpoints and self.checkpoints.config_key and self.config_file is None:
            raise ValueError("checkpoints.config_key needs command.config_file")
        return self


CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
