"""YAML loading that remembers where every key came from, so errors can name file:line."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.config.excerpt import is_key_name, value_excerpt
from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.core.safeload import (
    DEFAULT_LIMITS,
    ReadLimits,
    compose_yaml,
    construct_yaml,
    count_expanded,
    read_text_file,
)

# A key path such as ("train", "batch_size") or ("command", "argv", 0).
KeyPath = tuple[str | int, ...]

_KEY = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*")
_KEY_PART = re.compile(r"\.?([\w-]+)|\[(\d+)\]")


@dataclass
class YamlDocument:
    """A parsed mapping plus the line (1-based) of each key path, and a label for messages."""

    data: dict[str, Any]
    label: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        """`file:line` for the deepest known prefix of `path`, or just the label."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return f"{self.label}:{line}"
        return self.label

    def locate(self, message: str, keys: Collection[str] = ()) -> str:
        """`message` prefixed by the place of the key path it starts with (after this document's
        label, when it has one): its line, or the label alone for one of `keys` the document
        leaves out. Unchanged when it starts with no key, or is placed already."""
        if re.match(rf"{re.escape(self.label)}:\d", message):
            return message
        text = message.removeprefix(f"{self.label}: ")
        key = leading_key(text)
        if key is None or ((key[0],) not in self.lines and key[0] not in keys):
            return message
        return f"{self.where(key)}: {text}"

    @contextlib.contextmanager
    def locating(self, keys: Collection[str] = ()) -> Iterator[None]:
        """Checks made after validation (placeholders, inputs, GPUs) name a key path but not
        where it is: a UserError leaving this block gets its place in this document (`keys`:
        the top-level names that are keys even where the document leaves them out)."""
        try:
            yield
        except ConfigError as exc:
            exc.problems = [self.locate(p, keys) for p in exc.problems]
            exc.args = ("\n".join(exc.problems),)
            raise
        except UserError as exc:
            exc.args = (self.locate(exc.message, keys),)
            raise


def leading_key(text: str) -> KeyPath | None:
    """The key path `text` starts with, as every check writes it: `command.argv[0]: …`, or a
    dotted one followed by words (`knobs.bs (command.roles.micro_batch) is …`). A lone word
    followed by a space is plain text (`name 'x' …`), not a key."""
    found = _KEY.match(text)
    if found is None:
        return None
    after = text[found.end() : found.end() + 1]
    if after == ":" or (after == " " and any(c in found[0] for c in ".[")):
        return key_path(found[0])
    return None


def key_path(dotted: str) -> KeyPath:
    """`command.argv[0]` → ("command", "argv", 0)."""
    return tuple(int(index) if index else name for name, index in _KEY_PART.findall(dotted))


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], label: str, seen: set[int]) -> None:
    """Record the line of every key path; a node reached again through an alias is not walked
    again (an alias bomb would otherwise be expanded here)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in keys:
                # PyYAML silently keeps the last duplicate; a user would never notice the loss.
                named = f"{_dotted((*path, key))}: a" if is_key_name(key) else "a"
                raise ConfigError(
                    [f"{label}:{line}: {named} duplicate key (first at line {keys[key]}) — keep only one"]
                )
            keys[key] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, label, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk(item, (*path, i), lines, label, seen)


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_yaml(text: str, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> YamlDocument:
    """Parse YAML text that must hold a mapping (an empty document is an empty mapping), within
    `limits` (size, depth, values with aliases expanded: see `gpuwarden.core.safeload`)."""
    node = compose_yaml(text, label, limits)
    lines: dict[KeyPath, int] = {}
    data: Any = None
    if node is not None:
        count_expanded(node, label, limits)
        _walk(node, (), lines, label, set())
        data = construct_yaml(node, label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            f"{label}:1: expected a mapping of keys to values at the top level, "
            f"got {type(data).__name__} — write `key: value` lines"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise UserError(f"{label}: key {value_excerpt(bad[0])} is not a string — quote it or rename it")
    return YamlDocument(data=data, label=label, lines=lines)


def load_yaml_file(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> YamlDocument:
    """Read and parse a YAML file; a missing, unreadable or oversized file is a one-line UserError."""
    return parse_yaml(read_yaml_text(path, limits), str(path), limits)


def read_yaml_text(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    """A YAML file's text; missing, not a regular file, too large, unreadable or not UTF-8 is a
    one-line UserError."""
    return read_text_file(path, limits, what="YAML file")
