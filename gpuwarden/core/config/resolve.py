"""Resolve relative paths in a run spec against a base directory (the spec file's directory).

The daemon calls this at submit time: gpuwarden's runners start in the run's own directory (a
user's command in its `cwd`, by default the spec's directory), so a path such
as `model: models/tiny` must already point at the right place when the spec is written to
`attempts/<n>/resolved.yaml`. `~` is expanded too. Every `Path` field is handled, wherever it
sits in the spec (train/infer sections, `command.cwd`), so new path fields need no change here.
"""

from __future__ import annotations

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


def relative_paths(spec: RunSpec) -> list[str]:
    """The dotted keys of the spec's relative paths (`train.data`, `command.cwd`, a policy file):
    they start from the spec file's folder, so a copy written elsewhere, or a spec sent without
    that folder, points somewhere else."""
    policy = ["policy"] if relative_policy(spec.policy) is not None else []
    return [*_relative_in(spec, ""), *policy]


def _relative_in(model: BaseModel, prefix: str) -> Iterator[str]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, Path) and not value.expanduser().is_absolute():
            yield prefix + name
        elif isinstance(value, BaseModel):
            yield from _relative_in(value, f"{prefix}{name}.")


def moved_paths_note(moved: list[str], new: Path, old: Path, what: str) -> str:
    """What a copy of a spec written to another folder (`new`) than the original's (`old`) gets
    wrong: its relative paths now start there."""
    one = len(moved) == 1
    are = "is a relative path: it starts" if one else "are relative paths: they start"
    return (
        f"{', '.join(moved)} {are} from {new}, not from {old} — write the {what} next to the "
        f"original or make {'it' if one else 'them'} absolute"
    )
