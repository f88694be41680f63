"""Resolve relative paths in a run spec against a base directory (the spec file's directory).

The daemon calls this at submit time: gpuwarden's runners start in the run's own directory (a
user's command in its `cwd`, by default the spec's directory), so a path such
as `model: models/tiny` must already point at the right place when the spec is written to
`attempts/<n>/resolved.yaml`. `~` is expanded too. Every `Path` field is handled, wherever it
sits in the spec (train/infer sections, `command.cwd`), so new path fields need no change here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.policy import PolicyOverride, PolicyRef, relative_policy, resolve_policy

M = TypeVar("M", bound=BaseModel)


def _resolve_value(value: Any, base: Path) -> Any:
    if isinstance(value, Path):
        path = value.expanduser()
        return path if path.is_absolute() else base / path
    if isinstance(value, BaseModel):
        return _resolve_model(value, base)
    return value


def _resolve_model(model: M, base: Path) -> M:
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        new = _resolve_value(value, base)
        if new is not value:
            updates[name] = new
    return model.model_copy(update=updates) if updates else model


def resolve_relative_paths(spec: RunSpec, base: Path) -> RunSpec:
    """A copy of `spec` with every relative path made absolute against `base` (made absolute first),
    and a command without `cwd` run in `base`, as it would be typed there (`./train.sh`).

    Paths are joined, not `resolve()`d: symlinks stay as the user wrote them.
    """
    base = Path(base).expanduser().absolute()
    resolved = _resolve_model(spec, base)
    policy = _anchored_policy(resolved.policy, base)
    if policy is not resolved.policy:
        resolved = resolved.model_copy(update={"policy": policy})
    if resolved.command is not None and resolved.command.cwd is None:
        command = resolved.command.model_copy(update={"cwd": base})
        resolved = resolved.model_copy(update={"command": command})
    return resolved


def _anchored_policy(ref: PolicyRef | None, base: Path) -> PolicyRef | None:
    """`policy: ./mine.yaml` (or an override's `base:`) as a path from `base`, loaded once here so
    that a missing or invalid file is refused at submit, not at the run's first out-of-memory."""
    named = relative_policy(ref)
    if named is None:
        return ref
    anchored = str(base / named)
    new: PolicyRef = anchored
    if isinstance(ref, PolicyOverride):
        new = ref.model_copy(update={"base": anchored})
    try:
        resolve_policy(new)
    except UserError as exc:
        raise UserError(f"policy: {exc}", code=exc.code) from None
    return new


def rebased_paths(spec: RunSpec, old: Path, new: Path) -> dict[str, str]:
    """What a copy of `spec` (a file in folder `old`) written to folder `new` must say for it to
    run as the original does: each relative path (dotted key → value) as a path from `new` to the
    file the original names, and for a command that runs where its spec is (no `command.cwd`),
    `command.cwd` naming `old`. Empty when the two folders are one."""
    old, new = Path(old).expanduser().resolve(), Path(new).expanduser().resolve()
    if old == new:
        return {}
    moved = {key: os.path.relpath(old / value, new) for key, value in _relative_values(spec, "")}
    named = relative_policy(spec.policy)
    if named is not None:
        key = "policy" if isinstance(spec.policy, str) else "policy.base"
        path = os.path.relpath(old / named, new)
        moved[key] = path if "/" in path else f"./{path}"  # a bare word would name a built-in policy
    if spec.command is not None and spec.command.cwd is None:
        moved["command.cwd"] = os.path.relpath(old, new)
    return moved


def _relative_values(model: BaseModel, prefix: str) -> Iterator[tuple[str, Path]]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, Path) and not value.expanduser().is_absolute():
            yield prefix + name, value
        elif isinstance(value, BaseModel):
            yield from _relative_values(value, f"{prefix}{name}.")


def relative_paths(spec: RunSpec) -> list[str]:
    """The dotted keys of the spec's relative paths (`train.data`, `command.cwd`, a policy file):
    they start from the spec file's folder, so a copy written elsewhere, or a spec sent without
    that folder, points somewhere else."""
    policy = ["policy"] if relative_policy(spec.policy) is not None else []
    return [*(key for key, _ in _relative_values(spec, "")), *policy]


def moved_paths_note(moved: list[str], new: Path) -> str:
    """What a copy of a spec written to another folder (`new`) has changed besides: its relative
    paths, rewritten to start from there."""
    return f"relative paths rewritten to start from {new}, where this copy is: {', '.join(moved)}"
