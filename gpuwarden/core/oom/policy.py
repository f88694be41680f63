"""Retune policies: the ordered ladder of changes tried after an out-of-memory, with bounds.

A policy is YAML (shipped ones in `gpuwarden/core/oom/policies/`, described in docs/policies.md;
a user's own in `<config dir>/policies/`). A run spec names one, or gives
overrides merged onto a named base: `policy: {base: default, max_attempts: 5}`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from gpuwarden.core.config.validation import StrictModel, validate
from gpuwarden.core.config.yamlsource import load_yaml_file
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.classify import parse_size
from gpuwarden.core.paths import default_config_file

Action = Literal[
    "allocator_expandable_segments",
    "reduce_micro_batch",
    "gradient_checkpointing",
    "lower_precision",
    "reduce_max_length",
    "reduce_max_pixels",
    "reduce_max_new_tokens",
    "offload",
    "load_in_8bit",
    "reduce_generation_batch",
    "reduce_eval_batch",
    "wait_for_memory",
    "move_gpu",
    "reduce_world_size",
]
ACTIONS: tuple[str, ...] = get_args(Action)

# `world_size` keeps the effective batch (accumulation makes up the difference) but runs the gang
# on fewer GPUs, so it waits for the user's consent too.
SemanticChange = Literal["max_length", "max_pixels", "max_new_tokens", "effective_batch", "world_size"]

RetunableVerdict = Literal["gpu_capacity", "gpu_fragmentation", "gpu_contention", "host_oom"]

# Rungs that make the run smaller; contention is never answered by shrinking (oom.md).
SHRINKING: frozenset[str] = frozenset(ACTIONS) - {
    "wait_for_memory",
    "move_gpu",
    "reduce_world_size",
    "allocator_expandable_segments",
}
# A gang on fewer GPUs needs as much memory per GPU as before: it only answers GPUs taken away.
CONTENTION_ONLY: frozenset[str] = frozenset({"wait_for_memory", "move_gpu", "reduce_world_size"})

_MEMORY: list[RetunableVerdict] = ["gpu_capacity", "gpu_fragmentation", "host_oom"]
_GPU_MEMORY: list[RetunableVerdict] = ["gpu_capacity", "gpu_fragmentation"]
DEFAULT_WHEN: dict[str, list[RetunableVerdict]] = {
    "allocator_expandable_segments": ["gpu_fragmentation"],
    "reduce_micro_batch": _MEMORY,
    "gradient_checkpointing": _MEMORY,
    "lower_precision": _MEMORY,
    "reduce_max_length": _MEMORY,
    "reduce_max_pixels": _MEMORY,
    "reduce_max_new_tokens": _MEMORY,
    "offload": _GPU_MEMORY,
    "load_in_8bit": _GPU_MEMORY,
    "reduce_generation_batch": _MEMORY,
    "reduce_eval_batch": _MEMORY,
    "wait_for_memory": ["gpu_contention"],
    "move_gpu": ["gpu_contention"],
    "reduce_world_size": ["gpu_contention"],
}

# Which optional parameters each action reads; any other is an error, so a typo'd intent fails.
PARAMS_FOR: dict[str, frozenset[str]] = {
    "allocator_expandable_segments": frozenset({"variable"}),
    "reduce_micro_batch": frozenset(),
    "gradient_checkpointing": frozenset(),
    "lower_precision": frozenset({"precision"}),
    "reduce_max_length": frozenset({"factor", "min", "multiple_of"}),
    "reduce_max_pixels": frozenset({"factor", "min", "multiple_of"}),
    "reduce_max_new_tokens": frozenset({"factor", "min", "multiple_of"}),
    "offload": frozenset({"factor", "gpu_fraction", "cpu_memory"}),
    "load_in_8bit": frozenset(),
    "reduce_generation_batch": frozenset({"factor", "min"}),
    "reduce_eval_batch": frozenset({"factor", "min"}),
    "wait_for_memory": frozenset({"seconds"}),
    "move_gpu": frozenset(),
    "reduce_world_size": frozenset({"min"}),
}
# Every action takes `max_times`; these are the defaults where a rung would otherwise repeat
# for long (waiting forever, or lowering an offload budget in many small steps).
DEFAULT_MAX_TIMES: dict[str, int] = {"wait_for_memory": 3, "move_gpu": 1, "offload": 2}
_PARAM_NAMES = (
    "factor",
    "min",
    "multiple_of",
    "precision",
    "seconds",
    "max_times",
    "gpu_fraction",
    "cpu_memory",
)

POLICY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PACKAGE_POLICY_DIR = Path(__file__).resolve().parent / "policies"


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else "one of: " + ", ".join(choices)


def _check_allow(value: Any) -> Any:
    """An unknown entry in `allow` names the closest known change."""
    if isinstance(value, list):
        allowed = get_args(SemanticChange)
        for item in value:
            if isinstance(item, str) and item not in allowed:
                raise ValueError(f"unknown change {item!r} — {_suggest(item, allowed)}")
    return value


class Rung(StrictModel):
    """One change to try: an action, the verdicts it answers, and the action's parameters."""

    action: Action
    when: list[RetunableVerdict] = Field(
        default_factory=list, description="verdicts this rung answers (default depends on the action)"
    )
    factor: float | None = Field(None, gt=0, lt=1, description="multiplier for reductions, e.g. 0.5")
    min: int | None = Field(None, ge=1, description="never reduce the value below this")
    multiple_of: int | None = Field(None, ge=1, description="round reduced values down to a multiple")
    precision: Literal["bf16", "fp16"] | None = Field(
        None, description="lower_precision target; default bf16 where supported, else fp16"
    )
    seconds: float | None = Field(None, gt=0, le=86_400, description="wait_for_memory: how long to wait")
    max_times: int | None = Field(
        None,
        ge=1,
        description="how often this rung may be used in one run (default: no limit, but "
        "wait_for_memory 3, move_gpu 1, offload 2)",
    )
    gpu_fraction: float | None = Field(
        None, gt=0, lt=1, description="offload: share of the card given to weights at the first offload"
    )
    cpu_memory: str | None = Field(None, description='offload: CPU budget for accelerate, e.g. "30GiB"')
    variable: Literal["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] | None = Field(
        None, description="allocator setting's variable (the old name for PyTorch before 2.6)"
    )

    @field_validator("action", mode="before")
    @classmethod
    def _known_action(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ACTIONS:
            raise ValueError(f"unknown action {value!r} — {_suggest(value, ACTIONS)}")
        return value

    @field_validator("cpu_memory")
    @classmethod
    def _cpu_memory_is_size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_size(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a size — write it like 30GiB") from None
        return value

    @field_validator("when", mode="before")
    @classmethod
    def _known_verdicts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            allowed = get_args(RetunableVerdict)
            for item in value:
                if item in ("shape_bug", "not_oom"):
                    raise ValueError(f"{item} is never retuned — the run fails with the classifier's reason")
                if isinstance(item, str) and item not in allowed:
                    raise ValueError(f"unknown verdict {item!r} — {_suggest(item, allowed)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _default_when(cls, data: Any) -> Any:
        # The verdicts a rung answers follow from its action unless the policy says otherwise.
        if isinstance(data, dict) and not data.get("when") and data.get("action") in DEFAULT_WHEN:
            return {**data, "when": list(DEFAULT_WHEN[data["action"]])}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Rung:
        usable = PARAMS_FOR[self.action] | {"max_times"}
        for name in _PARAM_NAMES:
            if getattr(self, name) is not None and name not in usable:
                hint = ", ".join(sorted(usable)) if usable else "none"
                raise ValueError(f"`{name}` does not apply to action {self.action} (its parameters: {hint})")
        if self.action in SHRINKING and "gpu_contention" in self.when:
            raise ValueError(
                f"{self.action} cannot answer gpu_contention: other processes hold the memory, "
                "shrinking the run is not the fix — use wait_for_memory or move_gpu"
            )
        if self.action in CONTENTION_ONLY and any(v != "gpu_contention" for v in self.when):
            raise ValueError(f"{self.action} only answers gpu_contention")
        return self


class HangWatch(StrictModel):
    """The hang watchdog of multi-process runs: a gang that stops reporting progress is dumped,
    stopped and recorded as `hang` (then restarted when the spec's `restart.on` has `hang`)."""

    factor: float = Field(
        20.0,
        ge=2,
        le=10_000,
        description="K: hung after K × the median step time (× the steps between progress events) "
        "without progress",
    )
    min_seconds: float = Field(
        120.0, ge=1, le=86_400, description="the floor: never hung sooner than this after the last progress"
    )
    warmup_steps: int = Field(
        2,
        ge=0,
        le=100_000,
        description="steps of each attempt whose times are not counted (loading, compiling)",
    )


class HangOverride(StrictModel):
    """`hang` keys in a spec's inline policy: each one given replaces the base policy's."""

    factor: float | None = Field(None, ge=2, le=10_000)
    min_seconds: float | None = Field(None, ge=1, le=86_400)
    warmup_steps: int | None = Field(None, ge=0, le=100_000)


class RetunePolicy(StrictModel):
    """An ordered ladder of rungs and the bounds of one run's retuning."""

    name: str | None = Field(None, description="set from the file name when loaded by name")
    description: str | None = None
    ladder: list[Rung] = Field(min_length=1, description="rungs in the order they are tried")
    min_micro_batch: int = Field(1, ge=1, description="never shrink the micro-batch below this")
    max_attempts: int = Field(8, ge=0, description="retuned restarts before the run fails")
    max_total_seconds: float | None = Field(
        None, gt=0, description="seconds since the run's first OOM after which it fails (none = no limit)"
    )
    allow: list[SemanticChange] = Field(
        default_factory=list, description="changes to results the user accepts (they are off by default)"
    )
    headroom: float = Field(0.08, ge=0, lt=0.5, description="share of memory kept free when predicting")
    hang: HangWatch = Field(default_factory=HangWatch, description="the hang watchdog of multi-process runs")

    @field_validator("allow", mode="before")
    @classmethod
    def _known_allow(cls, value: Any) -> Any:
        return _check_allow(value)

    def allows(self, change: str) -> bool:
        """Whether the user accepted this change to results."""
        return change in self.allow


class PolicyOverride(StrictModel):
    """Inline policy in a run spec: any policy key, merged onto the named `base`."""

    base: str = Field("default", description="the named policy these keys override")
    description: str | None = None
    ladder: list[Rung] | None = Field(None, min_length=1, description="replaces the base's ladder whole")
    min_micro_batch: int | None = Field(None, ge=1)
    max_attempts: int | None = Field(None, ge=0)
    max_total_seconds: float | None = Field(None, gt=0)
    allow: list[SemanticChange] | None = None
    headroom: float | None = Field(None, ge=0, lt=0.5)
    hang: HangOverride | None = Field(None, description="keys given here replace the base's")

    @field_validator("allow", mode="before")
    @classmethod
    def _known_allow(cls, value: Any) -> Any:
        return _check_allow(value)


PolicyRef = str | PolicyOverride


def policy_search_dirs() -> list[Path]:
    """Where named policies are looked up: the user's config dir first, then the package."""
    return [default_config_file().parent / "policies", PACKAGE_POLICY_DIR]


def available_policies(search_dirs: Sequence[Path] | None = None) -> list[str]:
    """Names of every policy found, sorted."""
    names: set[str] = set()
    for directory in search_dirs if search_dirs is not None else policy_search_dirs():
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.yaml"))
    return sorted(names)


def _policy_file(name: str, search_dirs: Sequence[Path]) -> Path:
    if not POLICY_NAME_RE.match(name):
        raise UserError(
            f"{name!r} is not a policy name — use letters, digits, '.', '_' or '-', or a .yaml path"
        )
    for directory in search_dirs:
        candidate = directory / f"{name}.yaml"
        # A folder, FIFO or dangling link under the name is still the user's policy: loading it
        # names what is wrong with it, where "unknown policy" would contradict the listing.
        if candidate.exists() or candidate.is_symlink():
            return candidate
    known = available_policies(search_dirs)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else "available: " + ", ".join(known)
    raise UserError(f"unknown retune policy {name!r} — {hint}", code="unknown_policy")


def load_policy_file(path: Path, name: str | None = None) -> RetunePolicy:
    """Load and validate one policy file; problems are one line each with file:line."""
    doc = load_yaml_file(path)
    policy = validate(RetunePolicy, doc.data, doc.where)
    if policy.name is None:
        policy.name = name if name is not None else path.stem
    return policy


def policy_path(ref: str) -> Path | None:
    """The file a policy reference names (`./mine.yaml`, `~/p/x.yml`), or None for a name."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        return Path(ref).expanduser()
    return None


def relative_policy(ref: PolicyRef | None) -> str | None:
    """A spec's policy file named by a relative path (itself, or an override's `base`): it starts
    from the spec's folder, not from wherever the reading process runs."""
    named = ref if isinstance(ref, str) or ref is None else ref.base
    path = None if named is None else policy_path(named)
    return named if path is not None and not path.is_absolute() else None


def load_policy(name_or_path: str, *, search_dirs: Sequence[Path] | None = None) -> RetunePolicy:
    """A policy by name (`default`) or by path (`./mine.yaml`)."""
    path = policy_path(name_or_path)
    if path is not None:
        return load_policy_file(path)
    dirs = list(search_dirs) if search_dirs is not None else policy_search_dirs()
    return load_policy_file(_policy_file(name_or_path, dirs), name_or_path)


def default_policy_name(kind: str | None) -> str:
    """The policy a run gets when its spec names none: generation has its own ladder."""
    return "inference" if kind == "infer" else "default"


def resolve_policy(
    ref: PolicyRef | None,
    *,
    kind: str | None = None,
    search_dirs: Sequence[Path] | None = None,
    label: str = "policy",
) -> RetunePolicy:
    """The policy a run uses: a name, a path, inline overrides on a named base, or the default."""
    if ref is None:
        return load_policy(default_policy_name(kind), search_dirs=search_dirs)
    if isinstance(ref, str):
        return load_policy(ref, search_dirs=search_dirs)
    base = load_policy(ref.base, search_dirs=search_dirs)
    merged = base.model_dump(exclude={"name"})
    for key in ref.model_fields_set - {"base"}:
        value = getattr(ref, key)
        if value is None:
            continue  # not given (a stored spec carries every key, unset ones as null)
        if key == "ladder":
            merged[key] = [r.model_dump() for r in value]
        elif key == "hang":
            merged[key] = {**merged[key], **value.model_dump(exclude_none=True)}
        else:
            merged[key] = value
    policy = validate(RetunePolicy, merged, lambda loc: f"{label} (base {ref.base!r} + overrides)")
    policy.name = f"{base.name}+overrides"
    return policy


__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_TIMES",
    "DEFAULT_WHEN",
    "PACKAGE_POLICY_DIR",
    "Action",
    "HangWatch",
    "PolicyOverride",
    "PolicyRef",
    "RetunePolicy",
    "Rung",
    "SemanticChange",
    "available_policies",
    "default_policy_name",
    "load_policy",
    "load_policy_file",
    "policy_path",
    "policy_search_dirs",
    "relative_policy",
    "resolve_policy",
]
