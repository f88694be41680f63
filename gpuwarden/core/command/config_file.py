"""A user's own config file (YAML, JSON or TOML): read a key, write a copy with keys changed.

Round-trip libraries keep what the user wrote: ruamel.yaml keeps comments, key order, quotes and
indentation of YAML; tomlkit keeps TOML's formatting; JSON keeps key order and its indent (it has
no comments). Only the keys gpuwarden changes differ in the copy, so its diff against the user's
file shows exactly the retune. The user's file is only ever read.
"""

from __future__ import annotations

import difflib
import io
import itertools
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.core.command.toml_bounds import check_toml_bounds
from gpuwarden.core.errors import UserError
from gpuwarden.core.safeload import (
    DEFAULT_LIMITS,
    check_structure,
    compose_yaml,
    count_expanded,
    load_json,
    read_text_file,
)

if TYPE_CHECKING:
    from ruamel.yaml import YAML

# The round-trip libraries (65 modules, about 5 MB) are imported where a config file is read or
# written: the daemon imports this module for every command run but reads one only for runs with
# a `command.config_file`, and they stay out of its memory until then.

_MISSING = object()
_JSON_INDENT_RE = re.compile(r"^\{\s*\n([ \t]+)\S", re.M)


def _yaml(text: str) -> YAML:
    """A round-trip YAML instance that writes with the file's own indentation."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never re-wrap a long line the user wrote on one line
    try:
        _, indent, block_seq_indent = load_yaml_guess_indent(text)
    except YAMLError:
        indent, block_seq_indent = None, None
    # ruamel's guess is the sequences' indent where the file has a nested list (`callbacks:` then
    # `    - x`): a mapping nested under a key may be indented less, and is measured on its own.
    mapping = _mapping_indent(text) or indent or 2
    yaml.indent(mapping=mapping, sequence=indent or mapping, offset=block_seq_indent or 0)
    return yaml


def _mapping_indent(text: str) -> int | None:
    """How far the file indents a mapping nested under a key: the first `key:` line (nothing after
    it but a comment) whose next significant line is a deeper key, not a list item."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for line, following in itertools.pairwise(lines):
        head = line.split(" #", 1)[0].rstrip()
        if not head.endswith(":") or following.lstrip().startswith("-"):
            continue
        deeper = _indent_of(following) - _key_column(line)
        if deeper > 0:
            return deeper
    return None


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _key_column(line: str) -> int:
    """Where a line's key starts: after its indent and any list dashes (`  - model:` → 4)."""
    return len(line) - len(line.lstrip(" -"))


@dataclass
class ConfigDocument:
    """A parsed config file that can be written back with its formatting kept."""

    path: Path
    text: str
    data: Any
    fmt: str  # "yaml" | "json" | "toml"

    def get(self, key: str) -> Any:
        """The plain value at a dotted key path, or raise KeyError when a part is missing."""
        node = self.data
        for part in key.split("."):
            node = _child(node, part)
            if node is _MISSING:
                raise KeyError(key)
        return _plain(node)

    def set(self, key: str, value: Any) -> None:
        """Set the value at a key path, creating missing mappings on the way."""
        parts = key.split(".")
        node = self.data
        for part in parts[:-1]:
            child = _child(node, part)
            if child is _MISSING:
                if not isinstance(node, dict):
                    raise UserError(f"{self.path}: cannot add {key!r}: {part!r} is inside a list")
                node[part] = {} if self.fmt != "toml" else _tomlkit().table()
                child = node[part]
            node = child
        last = parts[-1]
        if isinstance(node, list):
            if not (last.isdigit() and int(last) < len(node)):
                raise UserError(f"{self.path}: {key!r}: no item {last} in that list")
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise UserError(f"{self.path}: {key!r}: {parts[-2] if len(parts) > 1 else 'the file'} is a value")

    def dump(self) -> str:
        if self.fmt == "yaml":
            out = io.StringIO()
            _yaml(self.text).dump(self.data, out)
            return out.getvalue()
        if self.fmt == "toml":
            return str(_tomlkit().dumps(self.data))
        match = _JSON_INDENT_RE.search(self.text)
        # The file's own indent; a file written on one line stays on one line.
        indent: int | str | None = match.group(1) if match else (2 if "\n" in self.text.strip() else None)
        body = json.dumps(self.data, indent=indent, ensure_ascii=False)
        return body + ("\n" if self.text.endswith("\n") else "")


def _tomlkit() -> Any:
    import tomlkit

    return tomlkit


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part, _MISSING)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _MISSING


def _plain(value: Any) -> Any:
    """ruamel and tomlkit wrap scalars in their own types; knobs hold plain ones."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if value is None:
        return None
    return value


def config_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    if suffix == ".toml":
        return "toml"
    raise UserError(f"{path}: config files are .yaml, .yml, .json or .toml")


# A program's own config is a few kilobytes; these bounds are the spec's, so a link to /dev/zero, a
# FIFO, a 50 MB file or one nested 100 000 deep is refused in milliseconds, before the round-trip
# libraries (pure Python, tens of MB per MB of text) ever see it.
CONFIG_FILE_LIMITS = DEFAULT_LIMITS


def read_config_text(path: Path) -> str:
    """The config file's text, read as every input is (a regular file, within the size limit,
    UTF-8); anything else is one UserError line naming `command.config_file`."""
    try:
        return read_text_file(path, CONFIG_FILE_LIMITS, what="config file")
    except UserError as exc:
        raise UserError(f"command.config_file: {exc.message}") from None


def load_config(path: Path) -> ConfigDocument:
    """Parse the user's config file within the spec's bounds (size, nesting, values with aliases
    expanded); a missing, hostile or malformed file is one UserError line."""
    fmt = config_format(path)
    text = read_config_text(path)
    checked = _bounded_parse(text, fmt, str(path))
    from ruamel.yaml.error import YAMLError
    from tomlkit.exceptions import TOMLKitError

    try:
        if fmt == "yaml":
            data = _yaml(text).load(text)
        elif fmt == "toml":
            data = _tomlkit().parse(text)
        else:
            data = checked  # the bounded reader's own result: json keeps the file's key order
    except (YAMLError, TOMLKitError, ValueError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not valid {fmt.upper()} ({first[:200]}) — fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of keys, not {type(data).__name__}")
    return ConfigDocument(path, text, data, fmt)


def _bounded_parse(text: str, fmt: str, label: str) -> Any:
    """Parse with readers that stop at the bounds as they read: libyaml's events composed without
    recursion, the C JSON scanner, tomllib (its recursion caught at once) and an iterative count.
    Returns what JSON and TOML parse to (YAML's node graph is only checked)."""
    if fmt == "yaml":
        root = compose_yaml(text, label, CONFIG_FILE_LIMITS)
        if root is not None:
            count_expanded(root, label, CONFIG_FILE_LIMITS)
        return None
    if fmt == "json":
        return load_json(text, label, CONFIG_FILE_LIMITS)
    check_toml_bounds(text, label, CONFIG_FILE_LIMITS)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise UserError(
            f"{label}: nested deeper than {CONFIG_FILE_LIMITS.max_depth} levels — flatten it"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{label}: not valid TOML ({str(exc)[:200]}) — fix the file") from None
    check_structure(data, label, CONFIG_FILE_LIMITS)
    return data


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    """The copy's changes against the user's file, as `diff -u` shows them ("" when equal)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), old_name, new_name, n=1
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
