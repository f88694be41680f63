"""Starting points per GPU memory tier: what a run on an 8, 12, 16, 24, 40/48, 80 or 141 GB card
should start with, from published tuning guides (document parsing, image restoration, batched
generation, LLM fine-tuning).

The table is YAML shipped in the package (`profiles.yaml`, next to this module). Cards report a
little less than their nominal size (an "80 GB" H100 reports 79.6 GiB), so a tier is reached at
94 % of its nominal size.
"""

from __future__ import annotations

import copy
import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from gpuwarden.core.config.validation import StrictModel, validate
from gpuwarden.core.config.yamlsource import load_yaml_file
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.classify import parse_size
from gpuwarden.core.units import GIB

PACKAGE_PROFILES = Path(__file__).resolve().parent / "profiles.yaml"
# A card reaches a tier at this share of the tier's nominal size.
TIER_TOLERANCE = 0.94
# max_memory never promises more than the card minus this (the CUDA context and the desktop need
# it). The tables leave 1 GiB of the nominal size; cards report slightly less than nominal.
SYSTEM_RESERVE = 768 << 20

Kind = Literal["train", "infer"]
TrainTask = Literal["causal_lm", "image"]
InferTask = Literal["generate", "image_to_text"]


class Tier(StrictModel):
    """One memory tier: nominal size and spec-shaped starting values per kind and task."""

    gb: float = Field(gt=0, description="nominal memory of the tier in GB, as sold")
    train: dict[TrainTask, dict[str, Any]] = Field(default_factory=dict)
    infer: dict[InferTask, dict[str, Any]] = Field(default_factory=dict)


class ProfileTable(StrictModel):
    """Every tier, smallest first."""

    tiers: list[Tier] = Field(min_length=1)

    @field_validator("tiers")
    @classmethod
    def _ascending(cls, tiers: list[Tier]) -> list[Tier]:
        sizes = [t.gb for t in tiers]
        if sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
            raise ValueError(f"tiers must be in ascending order of gb without repeats (got {sizes})")
        return tiers


def load_profile_table(path: Path = PACKAGE_PROFILES) -> ProfileTable:
    """Load and validate a profile table; problems are one line each with file:line."""
    doc = load_yaml_file(path)
    return validate(ProfileTable, doc.data, doc.where)


@lru_cache(maxsize=1)
def _shipped_table() -> ProfileTable:
    return load_profile_table(PACKAGE_PROFILES)


def tier_for(memory_total_bytes: int, table: ProfileTable | None = None) -> Tier:
    """The largest tier the card reaches; the smallest tier for a card below every tier."""
    tiers = (table or _shipped_table()).tiers
    gib = memory_total_bytes / GIB
    reached = [t for t in tiers if gib >= t.gb * TIER_TOLERANCE]
    return reached[-1] if reached else tiers[0]


def _clamp_budget(values: dict[str, Any], memory_total_bytes: int) -> None:
    """Cap each GPU entry of max_memory at the card minus the system reserve."""
    budget = values.get("max_memory")
    if not isinstance(budget, dict):
        return
    ceiling = max(memory_total_bytes - SYSTEM_RESERVE, 0)
    for key, size in list(budget.items()):
        if str(key).isdigit() and parse_size(str(size)) > ceiling:
            budget[key] = f"{ceiling >> 20}MiB"


def profile_for(
    memory_total_bytes: int, kind: str, task: str, *, table: ProfileTable | None = None
) -> dict[str, Any]:
    """Starting values for a `kind` (train/infer) run of `task` on a card of this size.

    The result has the shape of the spec section it fills (e.g. `image: {base_channels: …}` for
    image training) plus `tier` ("16 GB", or "below 8 GB") naming the row used. Unknown kinds or
    tasks are a one-line UserError.
    """
    if memory_total_bytes <= 0:
        raise UserError(f"GPU memory must be positive, got {memory_total_bytes} bytes")
    tasks: tuple[str, ...]
    if kind == "train":
        tasks = get_args(TrainTask)
    elif kind == "infer":
        tasks = get_args(InferTask)
    else:
        raise UserError(f"no profiles for kind {kind!r} — use train or infer")
    if task not in tasks:
        close = difflib.get_close_matches(task, list(tasks), n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else "tasks: " + ", ".join(tasks)
        raise UserError(f"no {kind} profile for task {task!r} — {hint}")
    tier = tier_for(memory_total_bytes, table)
    rows: dict[Any, dict[str, Any]] = dict(tier.train) if kind == "train" else dict(tier.infer)
    values = copy.deepcopy(rows.get(task, {}))
    _clamp_budget(values, memory_total_bytes)
    reached = memory_total_bytes / GIB >= tier.gb * TIER_TOLERANCE
    values["tier"] = f"{tier.gb:g} GB" if reached else f"below {tier.gb:g} GB"
    return values


__all__ = ["PACKAGE_PROFILES", "ProfileTable", "Tier", "load_profile_table", "profile_for", "tier_for"]
