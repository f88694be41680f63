"""Request bodies: submitting, stopping and editing runs."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuwarden.core.config.spec_command import KnobValue

MAX_SPEC_YAML = 1_000_000
MAX_ENV_VARIABLES = 4096
# Room for any shell's environment, well inside the request body's cap; Linux refuses more than
# 128 KiB for one variable anyway.
MAX_ENV_CHARS = 256 * 1024
# What execve can pass on: any name but an empty one, one with `=` or a NUL. Not the shell's
# identifier rule: exported bash functions (`BASH_FUNC_module%%`) are in many users' environments.
ENV_NAME_PATTERN = r"^[^=\x00]+$"


class SubmitRequest(BaseModel):
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
    spec_yaml: str | None = Field(None, max_length=MAX_SPEC_YAML)
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
        max_length=MAX_ENV_VARIABLES,
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
        size = sum(len(name) + len(value) + 2 for name, value in environment.items())
        if size > MAX_ENV_CHARS:
            raise ValueError(f"{size} characters in all, more than the {MAX_ENV_CHARS} a run may carry")
        return environment

    @model_validator(mode="after")
    def _one_source(self) -> SubmitRequest:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of `spec` (JSON) or `spec_yaml` (text)")
        if self.base_dir is not None and not os.path.isabs(self.base_dir):
            raise ValueError("base_dir must be an absolute path")
        return self


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: float | None = Field(
        None, ge=0, le=3600, description="SIGTERM → SIGKILL; default from settings"
    )


class EditRequest(BaseModel):
    """Fields of a queued run that may change; each replaces the spec's section whole."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    knobs: dict[str, KnobValue] | None = None
    resources: dict[str, Any] | None = None
    set: dict[str, KnobValue] | None = Field(
        None, description='dotted spec keys to set, e.g. {"train.batch_size": 4, "train.grad_accum_steps": 8}'
    )
