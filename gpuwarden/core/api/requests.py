"""Request bodies: submitting, stopping and editing runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from gpuwarden.core.api.base import ApiModel
from gpuwarden.core.config.spec_command import KnobValue

MAX_SPEC_YAML = 1_000_000
# What Linux passes to a program by default (ARG_MAX, a quarter of an 8 MiB stack): a shell's
# environment that its own programs can be started with fits. The request body's cap leaves room.
MAX_ENV_CHARS = 2 << 20
# What execve can pass on: any name but an empty one, one with `=` or a NUL. Not the shell's
# identifier rule: exported bash functions (`BASH_FUNC_module%%`) are in many users' environments.
ENV_NAME_PATTERN = r"^[^=\x00]+$"


class SubmitRequest(ApiModel):
    """A run spec as JSON (`spec`) or as YAML text (`spec_yaml`, relative paths against `base_dir`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # Exactly one of the two (the other absent or null), as the validator below checks.
            "oneOf": [
                {"required": ["spec"], "properties": {"spec": {"type": "object"}}},
                {"required": ["spec_yaml"], "properties": {"spec_yaml": {"type": "string"}}},
            ]
        },
    )

    spec: dict[str, Any] | None = None
    spec_yaml: str | None = Field(None, min_length=1, max_length=MAX_SPEC_YAML)
    base_dir: str | None = Field(
        None,
        description="absolute directory that relative paths in the spec start from (needed when it has any)",
        json_schema_extra={"pattern": "^/"},
    )
    label: str | None = Field(None, max_length=4096, description="file name used in error messages")
    check_inputs: bool = Field(
        True, description="refuse a spec whose model, data or cwd is missing (false: a run creates them)"
    )
    environment: dict[str, str] | None = Field(
        None,
        description="the submitter's environment, which the run's processes start from (absent: the"
        f" daemon's); at most {MAX_ENV_CHARS} characters in all; never shown back",
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )

    @field_validator("environment")
    @classmethod
    def _execable(cls, environment: dict[str, str] | None) -> dict[str, str] | None:
        """Refused here rather than when an attempt cannot start; values are never quoted back."""
        if environment is None:
            return None
        for name, value in environment.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"variable name {name!r} is empty or holds '=' or a NUL")
            if "\0" in value:
                raise ValueError(f"the value of {name} holds a NUL character")
        if (problem := environment_too_large(environment)) is not None:
            raise ValueError(problem)
        return environment

    @model_validator(mode="after")
    def _one_source(self) -> SubmitRequest:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of `spec` (JSON) or `spec_yaml` (text)")
        if self.base_dir is not None and not os.path.isabs(self.base_dir):
            raise ValueError("base_dir must be an absolute path")
        return self


def environment_too_large(environment: Mapping[str, str]) -> str | None:
    """Why `environment` is more than a run carries, or None (bounds the variables' number too)."""
    size = sum(len(name) + len(value) + 2 for name, value in environment.items())
    if size <= MAX_ENV_CHARS:
        return None
    return (
        f"the environment is {size / 2**20:.1f} MiB, more than the {MAX_ENV_CHARS >> 20} MiB a run carries"
        " — unset large variables (`env | sort`) or submit from a shell with fewer"
    )


class StopRequest(ApiModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: float | None = Field(
        None, ge=0, le=3600, description="SIGTERM → SIGKILL; default from settings"
    )


class EditRequest(ApiModel):
    """What may change in a run that is not running: the given knobs over its own, `resources`
    replaced whole, any spec key by its dotted path. The result is validated as a whole spec."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    knobs: dict[str, KnobValue | None] | None = Field(
        None,
        description="new values of some of the run's knobs, the others kept; null removes one. A name"
        " the run has no knob of is refused (a 400 listing its knobs)",
    )
    resources: dict[str, Any] | None = Field(None, description="replaces the spec's `resources` whole")
    set: dict[str, KnobValue] | None = Field(
        None,
        description='dotted spec keys to set, e.g. {"train.batch_size": 4, "train.grad_accum_steps": 8};'
        " `knobs.NAME` only for a knob the run has",
    )
