"""Roles: a command run's knobs seen under the names the retune maths uses.

The ladder, the memory model and the probes think in `batch_size`, `grad_accum_steps`,
`world_size`, `max_length`, … (the built-in training runner's names). A user's program calls its
micro-batch `per_device_train_batch_size` or `training.batch_size`; `command.roles` says which
knob plays which part. These functions translate both ways, so a retune of a user's program
keeps micro-batch × accumulation × world size exactly as it does for the built-in runners.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuwarden.core.config.role_names import ROLE_NAMES

if TYPE_CHECKING:
    from gpuwarden.core.config.spec import RunSpec
    from gpuwarden.core.config.spec_command import Roles


def _roles(spec: RunSpec) -> Roles | None:
    """The run's roles, or None for a command run that names none (its knobs keep their names)."""
    if spec.command is None:
        return None
    roles = spec.command.roles
    return roles if roles.model_dump(exclude_none=True) else None


def role_knobs(spec: RunSpec) -> dict[str, Any]:
    """A command run's knobs as the retune maths names them.

    With roles: only the knobs that have a role the maths knows, under its name (world size as
    a number when the role gives one). Without roles: the knobs as they are, so a knob the user
    named `batch_size` still works.
    """
    roles = _roles(spec)
    if roles is None:
        return dict(spec.knobs)
    out: dict[str, Any] = {}
    for role, canonical in ROLE_NAMES.items():
        target = getattr(roles, role)
        if isinstance(target, str) and target in spec.knobs:
            out[canonical] = spec.knobs[target]
        elif isinstance(target, int) and not isinstance(target, bool):
            out[canonical] = target
    return out


def knob_for(spec: RunSpec, canonical: str) -> str:
    """The spec's knob that a retune of `canonical` changes (itself when the run has no roles)."""
    roles = _roles(spec)
    if roles is None:
        return canonical
    role = next((r for r, c in ROLE_NAMES.items() if c == canonical), None)
    target = getattr(roles, role) if role is not None else None
    return target if isinstance(target, str) else canonical


def effective_batch_of(spec: Mapping[str, Any]) -> int | None:
    """micro-batch × accumulation × world size of a stored spec document, where it has them:
    a train run, or a command run whose roles (or knob names) say which knobs they are."""
    train = spec.get("train")
    if spec.get("kind") == "train" and isinstance(train, Mapping):
        return int(train["batch_size"]) * int(train["grad_accum_steps"]) * int(train["world_size"])
    if spec.get("kind") != "command":
        return None
    micro = _role_value(spec, "micro_batch")
    if micro is None:
        return None
    return micro * (_role_value(spec, "accum_steps") or 1) * (_role_value(spec, "world_size") or 1)


def world_size_of(spec: Mapping[str, Any]) -> int:
    """Processes training together in a stored spec document (1 where it names none)."""
    train = spec.get("train")
    if spec.get("kind") == "train" and isinstance(train, Mapping):
        return int(train.get("world_size") or 1)
    if spec.get("kind") != "command":
        return 1
    return _role_value(spec, "world_size") or 1


def _role_value(spec: Mapping[str, Any], role: str) -> int | None:
    """The whole number a command run's role names: through its roles, or its knobs' names."""
    knobs = spec.get("knobs") or {}
    roles = (spec.get("command") or {}).get("roles") or {}
    named = any(v is not None for v in roles.values())
    target = roles.get(role) if named else ROLE_NAMES[role]
    value = knobs.get(target) if isinstance(target, str) else target
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["effective_batch_of", "knob_for", "role_knobs", "world_size_of"]
