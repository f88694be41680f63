"""`{knob}` placeholders in a command run's argv and env.

`{name}` is replaced by the knob's value (`{name:.3f}` applies a format spec), `{{` and `}}` are a
literal brace. Besides the spec's knobs, the daemon provides `{run_id}`, `{run_dir}`, `{attempt}`,
`{events_file}` (the attempt's events.jsonl, so any program can report structured events),
`{config_file}` (the attempt's copy of `command.config_file`), `{resume_from}` (the newest
complete checkpoint, empty on a first attempt) and `{python}` (the interpreter gpuwarden runs
on). A knob's text value may use the built-ins too (`output_dir: "{run_dir}/outputs"`), so
wherever the knob goes (argv, a config key, a variable) it carries the filled-in text.
Placeholders are checked when the run is submitted, so a typo fails there with one line, not
minutes later in the child.

`{name=value}` is `true` when the knob's value (as text) is `value`, else `false`: one knob can
drive several switches, as `--bf16 {precision=bf16} --fp16 {precision=fp16}` does for a
program whose precision is two flags.

Optional placeholders, `{name?}`, may be empty. The rule for argv: an item that holds an empty
optional placeholder is left out; when that item is the placeholder alone and the item before it
is a flag (it starts with `-`, and has no `=` and no placeholder), the flag is left out too. So
`["--resume_from_checkpoint", "{resume_from?}"]` and `["--resume={resume_from?}"]` both vanish on
a first attempt and carry the checkpoint's path on later ones.

`{name?TEXT}` is TEXT when the placeholder has a value and nothing when it is empty: a switch that
takes no value, as argparse's `store_true` `--resume` of a script that finds its own checkpoint,
is `{resume_from?--resume}` (left out on a first attempt, `--resume` on later ones).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError

BUILTINS = ("run_id", "run_dir", "attempt", "events_file", "config_file", "resume_from", "python")

_FORMATTER = string.Formatter()


def render(template: str, values: Mapping[str, Any], where: str) -> str:
    """Substitute placeholders in one string; UserError naming `where` and the placeholder."""
    out: list[str] = []
    for literal, field, spec, conversion in _parse(template, where):
        out.append(literal)
        if field is not None:
            out.append(_fill(field, spec, conversion, values, where))
    return "".join(out)


def _parse(template: str, where: str) -> list[tuple[str, str | None, str | None, str | None]]:
    try:
        return list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise UserError(f"{where}: {exc} in {template!r} — write {{{{ and }}}} for literal braces") from None


def _split(field: str) -> tuple[str, str, str]:
    """A placeholder's name, its form (`""`, `"?"` or `"="`) and what follows the form's mark."""
    mark = min((i for i in (field.find("?"), field.find("=")) if i >= 0), default=-1)
    if mark < 0:
        return field, "", ""
    return field[:mark], field[mark], field[mark + 1 :]


def _fill(field: str, spec: str | None, conversion: str | None, values: Mapping[str, Any], where: str) -> str:
    """The text of one placeholder: `{name}`, `{name?}`, `{name?TEXT}`, `{name=value}`, with
    conversion and spec."""
    name, form, rest = _split(field)
    if not name.isidentifier():
        raise UserError(
            f"{where}: placeholder {{{field}}} is not a knob name — use {{name}}, or {{{{ for a brace"
        )
    if name not in values:
        known = ", ".join(sorted(values)) or "none"
        raise UserError(f"{where}: unknown placeholder {{{field}}} — knobs and built-ins are: {known}")
    if form == "=":
        return "true" if _as_text(values[name]) == rest else "false"
    if form == "?" and rest:
        # The parser took a `:` or `!` in the text for a format spec or a conversion: give them back.
        text = rest + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        return text if values[name] not in ("", None) else ""
    try:
        return format(_converted(values[name], conversion), spec or "")
    except (ValueError, TypeError) as exc:
        raise UserError(f"{where}: {{{field}:{spec}}}: {exc}") from None


def _as_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# `!s` and booleans read as YAML writes them (`true`, not `True`)
_CONVERSIONS: dict[str, Callable[[Any], str]] = {"r": repr, "a": ascii, "s": _as_text}


def _converted(value: Any, conversion: str | None) -> Any:
    if conversion in _CONVERSIONS:
        return _CONVERSIONS[conversion](value)
    return _as_text(value) if isinstance(value, bool) else value


def optional_fields(template: str) -> list[str]:
    """Names of the `{name?}` and `{name?TEXT}` placeholders in one string (unparsable text has none)."""
    try:
        fields = [_split(f) for _, f, _, _ in _FORMATTER.parse(template) if f]
    except ValueError:
        return []
    return [name for name, form, _ in fields if form == "?"]


def placeholder_names(template: str) -> set[str]:
    """Knob or built-in names a string uses, whatever the form (`{n}`, `{n?}`, `{n?T}`, `{n=v}`, `{n:f}`)."""
    try:
        fields = [f for _, f, _, _ in _FORMATTER.parse(template) if f]
    except ValueError:
        return set()
    return {_split(f)[0] for f in fields}


def _is_flag(item: str) -> bool:
    return item.startswith("-") and "=" not in item and "{" not in item


def render_argv(argv: list[str], values: Mapping[str, Any], where: str = "command.argv") -> list[str]:
    """argv with placeholders filled and empty optional ones left out (the module docstring's rule)."""
    out: list[str] = []
    for i, item in enumerate(argv):
        empty = [name for name in optional_fields(item) if values.get(name) in ("", None)]
        if not empty:
            out.append(render(item, values, f"{where}[{i}]"))
            continue
        # Render anyway, so a typo in this item fails even while its value is empty.
        render(item, {**values, **dict.fromkeys(empty, "")}, f"{where}[{i}]")
        alone = item.strip() == f"{{{empty[0]}?}}"
        if alone and i > 0 and out and _is_flag(argv[i - 1]) and out[-1] == argv[i - 1]:
            out.pop()
    return out


def template_values(spec: RunSpec, builtins: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The names a command may use: built-ins (placeholders at submit time) and the spec's knobs."""
    clash = sorted(set(spec.knobs) & set(BUILTINS))
    if clash:
        raise UserError(
            f"knobs.{clash[0]}: the name is reserved for a built-in placeholder — rename the knob"
        )
    values: dict[str, Any] = dict(builtins) if builtins is not None else dict.fromkeys(BUILTINS, "")
    only_builtins = dict(values)
    for name, value in spec.knobs.items():
        if isinstance(value, str) and "{" in value:
            value = render(value, only_builtins, f"knobs.{name}")
        values[name] = value
    return values


def render_command(
    spec: RunSpec, builtins: Mapping[str, Any] | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and env of a command run with placeholders filled; without `builtins` it only checks."""
    if spec.command is None:
        return [], {}
    values = template_values(spec, builtins)
    argv = render_argv(spec.command.argv, values)
    env = {name: render(value, values, f"command.env.{name}") for name, value in spec.command.env.items()}
    return argv, env


def check_command(spec: RunSpec) -> None:
    """Raise UserError at submit time when argv/env use an unknown placeholder or bad braces."""
    render_command(spec)
