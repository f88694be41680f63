"""YAML loading that remembers where every key came from, so errors can name file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.errors import ConfigError, UserError

# A key path such as ("train", "batch_size") or ("command", "argv", 0).
KeyPath = tuple[str | int, ...]


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


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], label: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                # PyYAML silently keeps the last duplicate; a user would never notice the loss.
                raise ConfigError(
                    [
                        f"{label}:{line}: {_dotted((*path, key))}: duplicate key (first at line "
                        f"{seen[key]}) — keep only one"
                    ]
                )
            seen[key] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, label)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk(item, (*path, i), lines, label)


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_yaml(text: str, label: str) -> YamlDocument:
    """Parse YAML text that must hold a mapping (an empty document is an empty mapping)."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            lines: dict[KeyPath, int] = {}
            if node is not None:
                _walk(node, (), lines, label)
                data = loader.construct_document(node)
            else:
                data = None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark else label
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"{where}: YAML syntax error: {problem} — fix the YAML there") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{label}: YAML error: {exc} — fix the YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            f"{label}:1: expected a mapping of keys to values at the top level, "
            f"got {type(data).__name__} — write `key: value` lines"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise UserError(f"{label}: key {bad[0]!r} is not a string — quote it or rename it")
    return YamlDocument(data=data, label=label, lines=lines)


def load_yaml_file(path: Path) -> YamlDocument:
    """Read and parse a YAML file; a missing or unreadable file is a one-line UserError."""
    return parse_yaml(read_yaml_text(path), str(path))


def read_yaml_text(path: Path) -> str:
    """A YAML file's text; missing, a directory, unreadable or not UTF-8 is a one-line UserError."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file — check the path") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a YAML file — give the file's path") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied — make it readable") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}) — save it as UTF-8") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror}) — check the path") from None
