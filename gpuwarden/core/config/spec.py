"""The run spec: what a user submits with `gpuwarden run SPEC.yaml` (or POST /v1/runs).

`kind: command` supervises any program (argv, env, cwd; no shell); `kind: train` and
`kind: infer` run gpuwarden's own runners (`spec_train.py`, `spec_infer.py`). Every kind shares
`resources`, `knobs` and the restart behaviour.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ByteSize, Field, field_validator, model_validator

from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.config.spec_tune import TuneSettings
from gpuwarden.core.config.validation import StrictModel, validate
from gpuwarden.core.config.yamlsource import YamlDocument, load_yaml_file, parse_yaml
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.policy import PolicyRef, resolve_policy

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

KnobValue = int | float | str | bool


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"{name!r} is not a valid environment variable name — use letters, digits, _")
    return env


class CommandSpec(StrictModel):
    """A program to run as-is: an argv list (no shell), extra environment, working directory."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None

    @field_validator("argv")
    @classmethod
    def _argv_not_blank(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (argv[0]) is empty — name the program to run")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(
                    f"{name!r} is not a valid environment variable name — use letters, digits, _"
                )
        return v


class Resources(StrictModel):
    """What a run needs from the machine."""

    gpus: int | list[str] = Field(
        1, description="how many GPUs (picked by free memory), or their UUIDs/indices; 0 = CPU only"
    )
    allow_cpu: bool = Field(True, description="with no GPU on the machine, run on the CPU instead")
    min_free_memory: ByteSize | None = Field(None, description="per GPU, e.g. 10GiB")
    memory_limit: ByteSize | None = Field(
        None, description="address-space limit (RLIMIT_AS) of the run's process, e.g. 6GiB"
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _indices_as_text(cls, v: Any) -> Any:
        # `gpus: [0, 1]` names GPUs by index; keep every entry as text like a UUID.
        if isinstance(v, list):
            return [str(g) if isinstance(g, int) and not isinstance(g, bool) else g for g in v]
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[str]) -> int | list[str]:
        if isinstance(v, int) and v < 0:
            raise ValueError("must be ≥ 0 (0 = CPU only)")
        if isinstance(v, list) and not v:
            raise ValueError("an empty list names no GPU — give a count or GPU UUIDs/indices")
        return v


class RunSpec(StrictModel):
    """A submitted run. Unknown keys are rejected, so typos never silently do nothing."""

    version: Literal[1] = 1
    name: str
    kind: Literal["command", "train", "infer"]
    description: str | None = None
    command: CommandSpec | None = None
    train: TrainSpec | None = None
    infer: InferSpec | None = None
    env: dict[str, str] = Field(
        default_factory=dict,
        description="extra environment for the run's process, any kind (retunes set allocator options here)",
    )
    knobs: dict[str, KnobValue] = Field(
        default_factory=dict, description="values substituted as {name} in argv/env of command runs"
    )
    resources: Resources = Field(default_factory=Resources)
    on_interrupt: Literal["resume", "leave"] = Field(
        "leave", description="when the daemon finds the run's process gone after a restart"
    )
    policy: PolicyRef | None = Field(
        None,
        description="retune policy after an OOM: a name from configs/policies, a .yaml path, "
        "or inline keys over a `base` policy (default: `default`, `inference` for infer runs)",
    )
    autotune: bool = Field(
        False, description="probe for the fastest micro-batch on this GPU before the first attempt"
    )
    tune: TuneSettings | None = Field(
        None, description="what `gpuwarden tune` and `autotune` optimise: objective, power-limit sweep"
    )
    profile: Literal["auto"] | None = Field(
        None, description="`auto`: knobs not set in the spec start from the detected GPU's memory tier"
    )

    @field_validator("env")
    @classmethod
    def _run_env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env_names(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @model_validator(mode="after")
    def _section_for_kind(self) -> RunSpec:
        sections = {"command": self.command, "train": self.train, "infer": self.infer}
        if sections[self.kind] is None:
            hint = {"command": "`argv:`", "train": "`task:`", "infer": "`task:`, `model:`, `input:`"}
            raise ValueError(f"kind '{self.kind}' needs a `{self.kind}:` section with {hint[self.kind]}")
        extra = [name for name, value in sections.items() if value is not None and name != self.kind]
        if extra:
            raise ValueError(f"kind '{self.kind}' does not use `{extra[0]}:` — remove it or change `kind`")
        return self

    @field_validator("policy")
    @classmethod
    def _policy_exists(cls, v: PolicyRef | None) -> PolicyRef | None:
        if v is not None:
            try:
                resolve_policy(v)
            except UserError as exc:  # reported at the spec's `policy:` key, not as a crash
                raise ValueError(str(exc)) from None
        return v


def spec_from_document(doc: YamlDocument) -> RunSpec:
    return validate(RunSpec, doc.data, doc.where)


def load_spec(path: Path) -> RunSpec:
    """Load and validate a run spec file; errors are ConfigError/UserError with file:line."""
    return spec_from_document(load_yaml_file(path))


def parse_spec(text: str, label: str = "spec") -> RunSpec:
    return spec_from_document(parse_yaml(text, label))


def spec_from_mapping(data: dict[str, Any], label: str = "spec") -> RunSpec:
    return validate(RunSpec, data, lambda loc: label)
