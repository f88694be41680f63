"""The run spec: what a user submits with `gpuwarden run SPEC.yaml` (or POST /v1/runs).

`kind: command` supervises any program (argv, env, cwd; no shell); `kind: train` and
`kind: infer` run gpuwarden's own runners (`spec_train.py`, `spec_infer.py`). Every kind shares
`resources`, `knobs` and the restart behaviour.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ByteSize,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuwarden.core.config.argv_flags import setting_name, valued_flags
from gpuwarden.core.config.excerpt import value_excerpt
from gpuwarden.core.config.spec_command import CommandSpec, KnobValue, check_env_names, check_no_nul
from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.config.spec_restart import RestartPolicy
from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.config.spec_tune import TuneSettings
from gpuwarden.core.config.validation import StrictModel, validate
from gpuwarden.core.config.yamlsource import YamlDocument, load_yaml_file, parse_yaml
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.policy import PolicyRef, relative_policy, resolve_policy
from gpuwarden.core.run_ref import NAME_RE, RUN_ID_RE
from gpuwarden.core.safeload import check_structure
from gpuwarden.core.units import size

# Below this an address-space limit leaves no room to start an interpreter: the process dies
# before it can report anything (a limit of 0 killed it with SIGSEGV).
MIN_MEMORY_LIMIT = 64 << 20
# The kernel takes a limit as a signed 64-bit count; far above any machine's memory.
MAX_BYTES = 1 << 60
# What names one GPU in `gpus: [...]`: an index as nvidia-smi numbers them, or a UUID as NVML
# gives it (a MIG instance's included).
GPU_NAME_RE = re.compile(r"^(\d{1,4}|(GPU|MIG)-[A-Za-z0-9-]{1,120})$")


_SIZE: TypeAdapter[ByteSize] = TypeAdapter(ByteSize)


class Resources(StrictModel):
    """What a run needs from the machine."""

    gpus: int | list[str] = Field(
        1, description="how many GPUs (picked by free memory), or their UUIDs/indices; 0 = CPU only"
    )
    allow_cpu: bool = Field(True, description="with no GPU on the machine, run on the CPU instead")
    min_free_memory: ByteSize | None = Field(None, description="per GPU, e.g. 10GiB")
    memory_limit: ByteSize | None = Field(
        None, description="address-space limit (RLIMIT_AS) of the run's process, e.g. 6GiB (at least 64MiB)"
    )
    nodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="machines the run's ranks span, one `gpuwarden exec` on each (inside a cluster "
        "job); `gpus` is per machine",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _indices_as_text(cls, v: Any) -> Any:
        # `gpus: [0, 1]` names GPUs by index; keep every entry as text like a UUID.
        if isinstance(v, list):
            return [str(g) if isinstance(g, int) and not isinstance(g, bool) else g for g in v]
        return v

    @field_validator("min_free_memory", "memory_limit", mode="before")
    @classmethod
    def _no_negative_size(cls, v: Any) -> Any:
        if (isinstance(v, str) and v.strip().startswith("-")) or (isinstance(v, int | float) and v < 0):
            raise ValueError(f"must be a positive size such as 6GiB (got {value_excerpt(v)})")
        if isinstance(v, str):
            try:
                _SIZE.validate_python(v)
            except ValidationError:
                # pydantic's own words name no fix: say what a size looks like
                raise ValueError(
                    f"{value_excerpt(v)} is not a size — write one such as 6GiB or 1500MB"
                ) from None
        return v

    @field_validator("min_free_memory", "memory_limit")
    @classmethod
    def _sizes_in_range(cls, v: ByteSize | None, info: ValidationInfo) -> ByteSize | None:
        if v is None:
            return v
        if v > MAX_BYTES:
            raise ValueError(f"{size(v)} is more than any machine has — leave it out for no limit")
        if info.field_name == "memory_limit" and v < MIN_MEMORY_LIMIT:
            raise ValueError(
                f"{size(v)} leaves no room to start a process — give at least {size(MIN_MEMORY_LIMIT)}"
            )
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[str]) -> int | list[str]:
        if isinstance(v, int) and v < 0:
            raise ValueError("must be ≥ 0 (0 = CPU only)")
        if isinstance(v, int) and v > 4096:
            raise ValueError(f"{v} GPUs is more than any machine has — give a count or GPU UUIDs/indices")
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list names no GPU — give a count or GPU UUIDs/indices")
            bad = [g for g in v if not GPU_NAME_RE.match(g)]
            if bad:
                raise ValueError(
                    f"{bad[0]!r} names no GPU — give indices (0, 1) or UUIDs (GPU-…) as `nvidia-smi -L` lists"
                )
            if len(set(v)) != len(v):
                raise ValueError(
                    f"{next(g for g in v if v.count(g) > 1)!r} is listed twice — name each GPU once"
                )
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
    restart: RestartPolicy | None = Field(
        None, description="restart from the last checkpoint after a failure that is not out of memory"
    )
    policy: PolicyRef | None = Field(
        None,
        description="retune policy after an OOM: a shipped name (default, conservative, inference), "
        "a .yaml path, or inline keys over a `base` policy (default: `default`, `inference` for infer runs)",
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

    @field_validator("knobs")
    @classmethod
    def _finite_knobs(cls, v: dict[str, KnobValue]) -> dict[str, KnobValue]:
        for name, value in v.items():
            if isinstance(value, str):
                check_no_nul(value, name)  # it may go into argv or a variable
            if isinstance(value, float) and not math.isfinite(value):
                # Substituted as `nan` or `inf` into argv, or sent as JSON, it means nothing.
                raise ValueError(f"{name}: {value} is not a finite number — give one, or quote it as text")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        if RUN_ID_RE.match(v):
            # A reference is tried as an id first: a run with this name could never be named.
            raise ValueError(
                f"{value_excerpt(v)} has the form of a run id (r + 10 hex digits) — choose another name"
            )
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

    @model_validator(mode="after")
    def _knob_references(self) -> RunSpec:
        if self.command is None:
            return self
        # A knob bound to a config key takes its value from the file when `knobs` has none.
        known = set(self.knobs) | {n for n, b in self.command.bind.items() if b.in_config}
        for name, binding in self.command.bind.items():
            if name not in known:
                raise ValueError(
                    f"command.bind.{name}: no knob {name!r} — add it under `knobs:` with its value"
                )
            if binding.env is not None and binding.env in self.command.env:
                raise ValueError(f"command.bind.{name}: {binding.env} is also set in command.env — keep one")
        # A framework preset makes knobs of the command's own flags later, and so does a role
        # that names a flag of the command (completing the spec checks roles again then): a role
        # may name one before it exists.
        preset = self.command.framework != "none"
        flags = valued_flags(self.command.argv)
        for role, name in self.command.roles.knob_names().items():
            if name not in known and not preset and setting_name(name) not in flags:
                flag = "--" + setting_name(name).replace("_", "-")
                raise ValueError(
                    f"command.roles.{role}: no knob {name!r} — add it to `knobs:`, bind it to a config "
                    f"key, or pass it as a flag of the command ({flag} VALUE)"
                )
        return self

    @model_validator(mode="after")
    def _ranks_match_gpus(self) -> RunSpec:
        check_gang_gpus(self)
        return self

    @field_validator("policy")
    @classmethod
    def _policy_exists(cls, v: PolicyRef | None) -> PolicyRef | None:
        # A relative path starts from the spec's folder, which only resolve_relative_paths knows:
        # the file is checked there, not against whatever folder this process runs in.
        if v is not None and relative_policy(v) is None:
            try:
                resolve_policy(v)
            except UserError as exc:  # reported at the spec's `policy:` key, not as a crash
                raise ValueError(str(exc)) from None
        return v


def check_gang_gpus(spec: RunSpec) -> None:
    """One process per GPU: `train.world_size` must equal the GPUs asked for on each machine times
    the machines (it sets their number when `resources.gpus` is not given), or run its ranks on
    the CPU (`gpus: 0`)."""
    resources = spec.resources
    if spec.kind == "command" and spec.command is not None and spec.command.launcher == "torchrun":
        if resources.gpus == 0:
            raise ValueError(
                "command.launcher torchrun starts one process per GPU and resources.gpus is 0 — "
                "set resources.gpus to the number of processes"
            )
        return
    _check_nodes(spec)
    if spec.kind != "train" or spec.train is None or spec.train.world_size == 1:
        return
    nodes = resources.nodes
    per_node = spec.train.world_size // nodes
    if "gpus" not in resources.model_fields_set:
        resources.gpus = per_node
        return
    asked = len(resources.gpus) if isinstance(resources.gpus, list) else resources.gpus
    if asked not in (0, per_node):
        where = "" if nodes == 1 else f" on each of {nodes} machines"
        raise ValueError(
            f"train.world_size {spec.train.world_size} starts {per_node} processes{where}, one per GPU, "
            f"but resources.gpus asks for {asked} — set resources.gpus: {per_node} (or "
            f"train.world_size: {asked * nodes}; gpus: 0 runs the processes on the CPU)"
        )


def _check_nodes(spec: RunSpec) -> None:
    """Several machines run one data-parallel gang: the ranks must share out evenly."""
    nodes = spec.resources.nodes
    if nodes == 1:
        return
    if spec.kind != "train" or spec.train is None:
        raise ValueError(
            f"resources.nodes {nodes} spreads ranks over machines: a training run's train.world_size "
            "or a command with command.launcher: torchrun — or set resources.nodes: 1"
        )
    world = spec.train.world_size
    if world % nodes or world < nodes:
        raise ValueError(
            f"train.world_size {world} does not share out over resources.nodes {nodes} — give a "
            f"multiple of {nodes} (each machine runs world_size / nodes ranks)"
        )


def spec_from_document(doc: YamlDocument) -> RunSpec:
    return validate(RunSpec, doc.data, doc.where)


def load_spec(path: Path) -> RunSpec:
    """Load and validate a run spec file; errors are ConfigError/UserError with file:line."""
    return spec_from_document(load_yaml_file(path))


def parse_spec(text: str, label: str = "spec") -> RunSpec:
    return spec_from_document(parse_yaml(text, label))


def spec_from_mapping(data: dict[str, Any], label: str = "spec") -> RunSpec:
    """Validate a spec given as data (JSON from the API, a stored spec), bounded like a file."""
    check_structure(data, label)
    return validate(RunSpec, data, lambda loc: label)
