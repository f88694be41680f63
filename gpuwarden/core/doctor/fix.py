"""`doctor --fix`: apply dotted-key edits to the user's YAML text, keeping everything else.

The edits work on the text, guided by the positions PyYAML's composer records, so comments,
key order, quoting and flow/block style of every untouched line survive: a value is replaced in
place, a missing key is added to its section (a section added where needed), and a removed key's
lines go. The result is parsed again after each edit, so positions are always fresh.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import yaml

from gpuwarden.core.doctor.spec_view import split_dotted
from gpuwarden.core.errors import UserError

INDENT = 2


def render_scalar(value: Any) -> str:
    """`value` as a YAML flow scalar that reads back as the same value."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    try:
        plain_ok = yaml.safe_load(text) == text and "\n" not in text and text.strip() == text
    except yaml.YAMLError:
        plain_ok = False
    # `#`, `{`, `,` and `: ` are fine in block context but not always inside a flow mapping.
    if plain_ok and not any(c in text for c in "#{}[],:&*!|>'\"%@`"):
        return text
    return json.dumps(text)  # a JSON string is a valid double-quoted YAML scalar


def _flow(path: tuple[str, ...], value: Any) -> str:
    """`a.b: v` as a flow value for key `a`: `{b: v}` (or just `v` for a one-part path)."""
    if len(path) == 1:
        return render_scalar(value)
    return "{" + f"{path[1]}: {_flow(path[1:], value)}" + "}"


def _block(path: tuple[str, ...], value: Any, indent: int) -> str:
    """Block lines for `path: value` starting at `indent` spaces."""
    pad = " " * indent
    if len(path) == 1:
        return f"{pad}{path[0]}: {render_scalar(value)}\n"
    return f"{pad}{path[0]}:\n" + _block(path[1:], value, indent + INDENT)


def _compose(text: str, label: str) -> yaml.MappingNode:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise UserError(f"{label}: cannot edit the YAML ({exc})") from None
    if not isinstance(node, yaml.MappingNode):
        raise UserError(f"{label}: expected a mapping at the top level")
    return node


def _line_start(text: str, line: int) -> int:
    """Index of the first character of 0-based `line` (len(text) past the end)."""
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos


def _last_leaf(node: yaml.Node) -> yaml.Node:
    """The node whose end is where a block collection really ends: PyYAML ends a block
    collection at the next token, which may be the following key's position."""
    while isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(last, tuple) else last
    return node


def _after_node(text: str, node: yaml.Node) -> int:
    """Index of the start of the line after the one `node` ends on."""
    end = _last_leaf(node).end_mark
    # A block scalar (`|`, `>`) ends at the start of the line after its last line.
    if end.column == 0 and end.index > 0 and text[end.index - 1] == "\n":
        return end.index
    return _line_start(text, end.line + 1)


def _find(mapping: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


def _insert(text: str, mapping: yaml.MappingNode, path: tuple[str, ...], value: Any) -> str:
    """Add `path: value` into `mapping` (which holds none of path[0])."""
    if mapping.flow_style:
        close = mapping.end_mark.index - 1
        sep = ", " if mapping.value else ""
        return text[:close] + f"{sep}{path[0]}: {_flow(path, value)}" + text[close:]
    if mapping.value:
        indent = mapping.value[0][0].start_mark.column
        at = _after_node(text, mapping.value[-1][1])
    else:
        indent, at = 0, len(text)
    if at > len(text) or (at == len(text) and text and not text.endswith("\n")):
        text += "\n"
        at = len(text)
    return text[:at] + _block(path, value, indent) + text[at:]


def _replace(text: str, node: yaml.Node, rendered: str, *, block: bool) -> str:
    """Put `rendered` where `node`'s value is; on a block line, the line's comment (which
    described the old value) becomes a note of what the value was."""
    start, end = node.start_mark.index, node.end_mark.index
    old = text[start:end].strip() or "empty"
    if start == end and start > 0 and text[start - 1] == ":":
        rendered = " " + rendered  # an empty value (`key:`) has no space after the colon
    if not block or "\n" in text[start:end]:
        return text[:start] + rendered + text[end:]
    eol = text.find("\n", end)
    eol = len(text) if eol < 0 else eol
    return text[:start] + rendered + f"  # doctor --fix: was {old}" + text[eol:]


def _remove(text: str, mapping: yaml.MappingNode, key_node: yaml.Node, value_node: yaml.Node) -> str:
    if mapping.flow_style:
        start, end = key_node.start_mark.index, value_node.end_mark.index
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith(","):
            end += len(rest) - len(stripped) + 1
            end += len(text[end:]) - len(text[end:].lstrip(" "))
        else:
            before = text[:start].rstrip()
            if before.endswith(","):
                start = len(before) - 1
        return text[:start] + text[end:]
    start = _line_start(text, key_node.start_mark.line)
    return text[:start] + text[_after_node(text, value_node) :]


def apply_edit(text: str, key: str, value: Any, *, remove: bool = False, label: str = "spec") -> str:
    """`text` with dotted `key` set to `value` (or removed); other lines are untouched."""
    path = split_dotted(key)
    parents: list[tuple[yaml.MappingNode, yaml.Node, yaml.Node]] = []
    node = _compose(text, label)
    for i, part in enumerate(path):
        found = _find(node, part)
        last = i == len(path) - 1
        if found is None:
            return text if remove else _insert(text, node, path[i:], value)
        key_node, value_node = found
        if last:
            if not remove:
                return _replace(text, value_node, render_scalar(value), block=not node.flow_style)
            if len(node.value) == 1 and parents:
                # Removing a section's only key: remove the section, which then takes its default.
                parent, parent_key, parent_value = parents[-1]
                return _remove(text, parent, parent_key, parent_value)
            return _remove(text, node, key_node, value_node)
        if not isinstance(value_node, yaml.MappingNode):
            if remove:
                return text
            # e.g. `optimizer:` left empty (null): the rest of the path becomes a flow mapping
            return _replace(text, value_node, _flow(path[i:], value), block=not node.flow_style)
        parents.append((node, key_node, value_node))
        node = value_node
    return text


def apply_fixes(text: str, fix: dict[str, Any], label: str = "spec") -> str:
    """Apply every edit of `fix` (None removes a key); sets before removals, so a renamed key
    (env PYTORCH_CUDA_ALLOC_CONF → PYTORCH_ALLOC_CONF) never leaves an empty section behind."""
    for key, value in fix.items():
        if value is not None:
            text = apply_edit(text, key, value, label=label)
    for key, value in fix.items():
        if value is None:
            text = apply_edit(text, key, None, remove=True, label=label)
    return text


def describe_fix(fix: dict[str, Any]) -> list[str]:
    """One line per edit, for the header of a fixed file and for the terminal."""
    return [f"{k}: removed" if v is None else f"{k}: {render_scalar(v)}" for k, v in fix.items()]


def with_header(text: str, fix: dict[str, Any], source: str, findings: list[str]) -> str:
    """Prefix the fixed YAML with a comment saying where it came from and what changed."""
    lines = [f"# Written by `gpuwarden doctor --fix` from {source}.", "# Changed:"]
    lines += [f"#   {line}" for line in describe_fix(fix)]
    if findings:
        lines += textwrap.wrap(
            ", ".join(findings), width=100, initial_indent="# Findings fixed: ", subsequent_indent="#   "
        )
    return "\n".join(lines) + "\n" + text
