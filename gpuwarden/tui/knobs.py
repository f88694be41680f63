"""The knobs of a run as the edit dialog names them: the settings a retune may change (micro-batch,
accumulation, precision …) for train and infer runs, the declared `knobs` of a command run.

A person types plain names (`batch_size=8`); they become the spec's dotted keys for train and
infer runs (`train.batch_size`), and stay knob names for command runs. A dotted key of any other
part of the spec passes through: the daemon validates the whole spec and says what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.core.config.knob_edit import not_a_knob
from gpuwarden.core.oom.retune import KIND_KNOBS

# The order a person reads them in (the sets in KIND_KNOBS have none).
_ORDER = (
    "batch_size",
    "grad_accum_steps",
    "precision",
    "max_length",
    "max_new_tokens",
    "max_pixels",
    "gradient_checkpointing",
    "world_size",
    "load_in_8bit",
    "device_map",
    "max_memory",
)

# Knobs that mean something to some tasks only: an image CNN has no sequence length, a text
# generator no image size.
_TASK_ONLY = {"max_length": frozenset({"causal_lm"}), "max_pixels": frozenset({"image_to_text"})}


def current_knobs(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """knob name → its value now, in reading order."""
    if kind == "command":
        knobs = spec.get("knobs")
        return dict(knobs) if isinstance(knobs, Mapping) else {}
    section = spec.get(kind)
    if not isinstance(section, Mapping):
        return {}
    names = sorted(KIND_KNOBS.get(kind, ()), key=lambda k: _ORDER.index(k) if k in _ORDER else len(_ORDER))
    task = section.get("task")
    return {
        name: section.get(name)
        for name in names
        if name in section and task in _TASK_ONLY.get(name, frozenset({task}))
    }


def knob_changes(kind: str, typed: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """What the daemon is asked to change; ValueError names an unknown knob and the known ones."""
    out: dict[str, Any] = {}
    known = set(knobs) | set(KIND_KNOBS.get(kind, ()))
    for key, value in typed.items():
        if "." in key:
            out[key] = value
        elif key not in known:
            raise ValueError(not_a_knob(key, list(knobs), kind))
        else:
            out[key if kind == "command" else f"{kind}.{key}"] = value
    return out
