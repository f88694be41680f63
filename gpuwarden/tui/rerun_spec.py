"""A run's spec again, with knobs changed: what `gpuwarden rerun` and the dashboard's "run
again" submit. The daemon keeps each run's spec as it last ran (paths absolute, a person's edits
and the retunes' settings included), so a finished run is run again without its file."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuwarden.core.errors import UserError
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
