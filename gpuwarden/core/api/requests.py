"""Request bodies: submitting, stopping and editing runs."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuwarden.core.config.spec_command import KnobValue

MAX_SPEC_YAML = 1_000_000


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
