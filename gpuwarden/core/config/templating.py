"""`{knob}` placeholders in a command run's argv and env.

`{name}` is replaced by the knob's value (`{name:.3f}` applies a format spec), `{{` and `}}` are a
literal brace. Besides the spec's knobs, the daemon provides `{run_id}`, `{run_dir}`, `{attempt}`
and `{events_file}` (the attempt's events.jsonl, so any program can report structured events).
Placeholders are checked when the run is submitted, so a typo fails there with one line, not
minutes later in the child.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError

BUILTINS = ("run_id", "run_dir", "attempt", "events_file")

_FORMATTER = string.Formatter()


def render(template: str, values: Mapping[str, Any], where: str) -> str:
    """Substitute placeholders in one string; UserError naming `where` and the placeholder."""
    out: list[str] = []
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise UserError(f"{where}: {exc} in {template!r} — write {{{{ and }}}} for literal braces") from None
    for literal, field, spec, conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if not field.isidentifier():
            raise UserError(
                f"{where}: placeholder {{{field}}} is not a knob name — use {{name}}, or {{{{ for a brace"
            )
        if field not in values:
            known = ", ".join(sorted(values)) or "none"
            raise UserError(f"{where}: unknown placeholder {{{field}}} — knobs and built-ins are: {known}")
        value = values[field]
        if conversion == "r":
            value = repr(value)
        elif conversion == "a":
            value = ascii(value)
        elif conversion == "s" or isinstance(value, bool):
            # YAML writes booleans lower-case; so do the placeholders
            value = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            out.append(format(value, spec or ""))
        except (ValueError, TypeError) as exc:
            raise UserError(f"{where}: {{{field}:{spec}}}: {exc}") from None
    return "".join(out)


def template_values(spec: RunSpec, builtins: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The names a command may use: built-ins (placeholders at submit time) and the spec's knobs."""
    clash = sorted(set(spec.knobs) & set(BUILTINS))
    if clash:
        raise UserError(
            f"knobs.{clash[0]}: the name is reserved for a built-in placeholder — rename the knob"
        )
    values: dict[str, Any] = dict(builtins) if builtins is not None else dict.fromkeys(BUILTINS, "")
    values.update(spec.knobs)
    return values


def render_command(
    spec: RunSpec, builtins: Mapping[str, Any] | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and env of a command run with placeholders filled; without `builtins` it only checks."""
    if spec.command is None:
        return [], {}
    values = template_values(spec, builtins)
    argv = [render(arg, values, f"command.argv[{i}]") for i, arg in enumerate(spec.command.argv)]
    env = {name: render(value, values, f"command.env.{name}") for name, value in spec.command.env.items()}
    return argv, env


def check_command(spec: RunSpec) -> None:
    """Raise UserError at submit time when argv/env use an unknown placeholder or bad braces."""
    render_command(spec)
