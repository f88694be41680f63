"""A run's spec again, with knobs changed: what `gpuwarden rerun` and the dashboard's "run
again" submit. The daemon keeps each run's spec as it last ran (paths absolute, a person's edits
and the retunes' settings included), so a finished run is run again without its file."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.roles import effective_batch_of
from gpuwarden.tui.knobs import current_knobs, knob_changes


def rerun_spec(
    kind: str, spec: Mapping[str, Any], typed: Mapping[str, Any], name: str | None = None
) -> dict[str, Any]:
    """A copy of a run's spec document with the knobs `typed` (name → value, as a person types
    them) changed, and its name when given; UserError for a name that is no knob of the run."""
    try:
        changes = knob_changes(kind, typed, current_knobs(kind, spec))
    except ValueError as exc:
        raise UserError(f"{exc} — `gpuwarden show RUN --json` shows its spec") from None
    document = copy.deepcopy(dict(spec))
    for key, value in changes.items():
        _set(document, key.split(".") if "." in key else ["knobs", key], value)
    if name is not None:
        document["name"] = name
    return document


def _set(document: dict[str, Any], path: list[str], value: Any) -> None:
    node = document
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def effective_batch_note(kind: str, old_spec: Mapping[str, Any], new_spec: Mapping[str, Any]) -> str | None:
    """One line when the knobs changed the effective batch (micro-batch × accumulation × world
    size), so the new run no longer trains as the old one did: what it changed, and the
    accumulation that would keep it."""
    old_batch, new_batch = _effective(old_spec), _effective(new_spec)
    if old_batch is None or new_batch is None or old_batch == new_batch:
        return None
    said = f"note: the effective batch changes, {old_batch} → {new_batch}"
    name, accum = _accumulation(kind, new_spec)
    if name is None or not isinstance(accum, int):
        return f"{said} (the run names no accumulation that could keep it)"
    keeps, remainder = divmod(old_batch * accum, new_batch)
    if remainder or keeps < 1:
        return f"{said} (no whole accumulation keeps it at this micro-batch)"
    return f"{said}; {name}={keeps} keeps it"


def _effective(spec: Mapping[str, Any]) -> int | None:
    try:
        return effective_batch_of(spec)
    except (KeyError, TypeError, ValueError):
        return None  # a value the daemon refuses: it says so itself


def _accumulation(kind: str, spec: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The accumulation's knob name (as `--knob` takes it) and its value in `spec`."""
    if kind == "train":
        return "grad_accum_steps", (spec.get("train") or {}).get("grad_accum_steps")
    if kind == "command":
        name = ((spec.get("command") or {}).get("roles") or {}).get("accum_steps")
        return (name, (spec.get("knobs") or {}).get(name)) if isinstance(name, str) else (None, None)
    return None, None
