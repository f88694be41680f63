"""Bounded reading of the YAML and JSON gpuwarden is given: every file, request and line has a
size, a depth and a value-count limit, each refused in milliseconds with one line.

Why each limit exists:
- size: a spec is a few kilobytes; reading (and holding) a file of gigabytes to say so is a
  denial of service. Files are read up to the limit plus one byte, never whole.
- depth: parsers, validators and JSON encoders recurse; thousands of `[` exhaust the stack.
  The YAML document is composed here, iteratively, so the check happens while parsing.
- values (aliases expanded): a "billion laughs" document is a few hundred bytes whose aliases
  expand to billions of values. The parsed graph shares them, but anything that walks the data
  (validation, line numbers, JSON output) would expand them; the count is taken on the graph
  without expanding it.

The C parser (libyaml) is used where PyYAML was built with it: a megabyte of YAML then parses in
milliseconds instead of seconds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwarden.core.errors import UserError

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class ReadLimits:
    """What one document may hold. The defaults are tens of times what the largest shipped file
    needs (the profiles: 3.5 KB, 360 values, 6 levels)."""

    max_bytes: int = MIB
    max_depth: int = 64
    max_values: int = 10_000

    def describe_size(self) -> str:
        return _size(self.max_bytes)


DEFAULT_LIMITS = ReadLimits()
# A spec file sent to the daemon: well under what its API accepts (1 000 000 characters, in a
# request of at most 1 MiB), so an oversized file is refused here naming the file, not there
# naming a request field.
SPEC_FILE_LIMITS = ReadLimits(max_bytes=256 * KIB)
# One event line of a run (events.jsonl): a `finished` event carries the whole report.
EVENT_LIMITS = ReadLimits(max_bytes=MIB, max_depth=32, max_values=10_000)

_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
C_LOADER = _LOADER is not yaml.SafeLoader


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n // KIB} KiB" if n % KIB == 0 else f"{n} bytes"


# -- files -----------------------------------------------------------------------------------------


def read_text_file(path: Path, limits: ReadLimits = DEFAULT_LIMITS, *, what: str = "file") -> str:
    """The UTF-8 text of a regular file no larger than `limits.max_bytes`; anything else (missing,
    a directory, a FIFO or device, too large, not UTF-8, unreadable) is a one-line UserError."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file — check the path") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a {what} — give the file's path") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied — make it readable") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror}) — check the path") from None
    except ValueError:  # a NUL in the path
        raise UserError(f"{str(path)!r}: a path cannot hold a NUL character — give the file's path") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{path}: is a directory, not a {what} — give the file's path")
        if not stat.S_ISREG(mode):
            raise UserError(f"{path}: not a regular file — give the path of a {what}")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limits.max_bytes + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror}) — check the path") from None
    finally:
        os.close(fd)
    if len(data) > limits.max_bytes:
        raise UserError(
            f"{path}: larger than {limits.describe_size()}, the limit for a {what} — "
            "give the right file (a spec or config is a few kilobytes)"
        )
    return decode_utf8(data, str(path))


def decode_utf8(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{label}: not UTF-8 text (byte {exc.start}) — save it as UTF-8") from None


def check_text_size(text: str, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> None:
    """Refuse text over the size limit (counted in characters, each at least a byte)."""
    if len(text) > limits.max_bytes:
        raise UserError(
            f"{label}: larger than {limits.describe_size()}, the limit for one document — "
            "send the spec itself (a few kilobytes)"
        )


# -- YAML ------------------------------------------------------------------------------------------


class _Open:
    """A collection being composed and, for a mapping, the key waiting for its value."""

    __slots__ = ("key", "node")

    def __init__(self, node: yaml.CollectionNode) -> None:
        self.node = node
        self.key: yaml.Node | None = None

    def add(self, child: yaml.Node) -> None:
        if isinstance(self.node, yaml.SequenceNode):
            self.node.value.append(child)
        elif self.key is None:
            self.key = child
        else:
            self.node.value.append((self.key, child))
            self.key = None


def _marked(label: str, mark: Any, problem: str) -> UserError:
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark is not None else label
    return UserError(f"{where}: {problem}")


def compose_yaml(text: str, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> yaml.Node | None:
    """The node graph of a single YAML document (None when empty), within `limits`.

    Composed from parser events without recursion, so depth and the number of values are
    checked as the document is read and a hostile one stops at the limit, not at the end.
    Aliases stay shared nodes; `count_expanded` bounds what they expand to.
    """
    check_text_size(text, label, limits)
    loader = _LOADER(text)
    try:
        return _compose(loader, label, limits)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, label) from None
    except yaml.YAMLError as exc:
        raise UserError(f"{label}: YAML error: {_one_line(str(exc))} — fix the YAML") from None
    finally:
        loader.dispose()


def _syntax_error(exc: yaml.MarkedYAMLError, label: str) -> UserError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    return _marked(label, mark, f"YAML syntax error: {problem} — fix the YAML there")


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())[:300]


def _compose(loader: Any, label: str, limits: ReadLimits) -> yaml.Node | None:
    loader.get_event()  # stream start
    if loader.check_event(yaml.StreamEndEvent):
        loader.get_event()
        return None
    loader.get_event()  # document start
    root = _Composer(loader, label, limits).document()
    loader.get_event()  # document end
    if not loader.check_event(yaml.StreamEndEvent):
        event = loader.peek_event()
        raise _marked(label, event.start_mark, "a second YAML document (---) — keep one document per file")
    return root


class _Composer:
    """One document's node graph built from parser events, each limit checked as its value arrives."""

    def __init__(self, loader: Any, label: str, limits: ReadLimits) -> None:
        self.loader = loader
        self.label = label
        self.limits = limits
        self.anchors: dict[str, yaml.Node] = {}
        self.stack: list[_Open] = []
        self.values = 0

    def document(self) -> yaml.Node:
        while True:
            node = self._node(self.loader.get_event())
            if node is None:  # a collection opened: its children come next
                continue
            if not self.stack:
                return node
            self.stack[-1].add(node)

    def _node(self, event: Any) -> yaml.Node | None:
        """The node `event` completes, or None when it opens a collection."""
        if isinstance(event, yaml.AliasEvent):
            return self._alias(event)
        if isinstance(event, yaml.ScalarEvent | yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return self._value(event)
        if isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            node = self.stack.pop().node
            node.end_mark = event.end_mark
            return node
        # the parser emits nothing else inside a document
        raise _marked(  # pragma: no cover
            self.label, event.start_mark, f"unexpected YAML event {type(event).__name__}"
        )

    def _alias(self, event: Any) -> yaml.Node:
        if event.anchor not in self.anchors:
            raise _marked(
                self.label,
                event.start_mark,
                f"alias *{event.anchor} names no anchor — define &{event.anchor} first",
            )
        return self.anchors[event.anchor]

    def _value(self, event: Any) -> yaml.Node | None:
        self.values += 1
        if self.values > self.limits.max_values:
            raise _marked(
                self.label,
                event.start_mark,
                f"more than {self.limits.max_values} values, the limit for one document — "
                "a spec or config holds hundreds",
            )
        node = _new_node(self.loader, event)
        if event.anchor is not None:
            if event.anchor in self.anchors:
                raise _marked(self.label, event.start_mark, f"anchor &{event.anchor} is defined twice")
            self.anchors[event.anchor] = node
        if not isinstance(node, yaml.CollectionNode):
            return node
        if len(self.stack) >= self.limits.max_depth:
            raise _marked(
                self.label,
                event.start_mark,
                f"nested deeper than {self.limits.max_depth} levels — flatten it",
            )
        self.stack.append(_Open(node))
        return None


def _new_node(loader: Any, event: Any) -> yaml.Node:
    # libyaml's marks are its own class with the same fields as PyYAML's
    start: Any = event.start_mark
    if isinstance(event, yaml.ScalarEvent):
        tag = event.tag
        if tag is None or tag == "!":
            tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        end: Any = event.end_mark
        return yaml.ScalarNode(tag, event.value, start, end, style=event.style)
    kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(kind, None, event.implicit)
    return kind(tag, [], start, None, flow_style=event.flow_style)


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value


def count_expanded(root: yaml.Node, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> None:
    """Refuse a graph whose aliases expand past `limits` (values or depth), or refer to themselves.

    Each distinct node is visited once (post-order, no recursion): its expanded size is one plus
    its children's, so the bound is found without building the expansion.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, done = todo.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = list(_children(node))
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > limits.max_values:
                raise _marked(
                    label,
                    node.start_mark,
                    f"its aliases expand to more than {limits.max_values} values — write the values out "
                    "or use fewer aliases",
                )
            if depth[key] > limits.max_depth:
                raise _marked(
                    label,
                    node.start_mark,
                    f"its aliases nest deeper than {limits.max_depth} levels — use fewer aliases",
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise _marked(label, node.start_mark, "an alias refers to the value that contains it — remove it")
        on_path.add(key)
        todo.append((node, True))
        todo.extend((child, False) for child in _children(node) if id(child) not in size)


def construct_yaml(root: yaml.Node, label: str) -> Any:
    """Python values of a composed (and counted) graph with the safe constructors: tags such as
    `!!python/object` are refused, never run."""
    loader = _LOADER("")
    try:
        return loader.construct_document(root)
    except yaml.constructor.ConstructorError as exc:
        problem = exc.problem or "cannot build this value"
        if "constructor for the tag" in problem:
            problem = f"{problem} — gpuwarden reads plain YAML values only: remove the tag"
        else:
            problem = f"{problem} — fix the YAML there"
        raise _marked(label, exc.problem_mark, problem) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, label) from None
    except yaml.YAMLError as exc:
        raise UserError(f"{label}: YAML error: {_one_line(str(exc))} — fix the YAML") from None
    finally:
        loader.dispose()


def load_yaml_value(text: str, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> Any:
    """Any bounded YAML value (a scalar typed into a form, a list…); None for an empty text."""
    root = compose_yaml(text, label, limits)
    if root is None:
        return None
    count_expanded(root, label, limits)
    return construct_yaml(root, label)


# -- JSON --------------------------------------------------------------------------------------------


def load_json(text: str | bytes, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> Any:
    """A JSON value within `limits`; a one-line UserError for anything else."""
    import json

    if len(text) > limits.max_bytes:
        raise UserError(f"{label}: larger than {limits.describe_size()}, the limit for one JSON document")
    try:
        value = json.loads(text)
    except RecursionError:
        raise UserError(f"{label}: JSON nested deeper than {limits.max_depth} levels") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{label}: not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:
        raise UserError(f"{label}: not valid JSON ({_one_line(str(exc))})") from None
    check_structure(value, label, limits)
    return value


def check_structure(value: Any, label: str, limits: ReadLimits = DEFAULT_LIMITS) -> None:
    """Refuse parsed data (JSON, or a mapping handed over by a caller) nested deeper than the
    limit or holding more values; shared objects count each time they appear, as they would
    when encoded."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while todo:
        item, level = todo.pop()
        seen += 1
        if seen > limits.max_values:
            raise UserError(f"{label}: more than {limits.max_values} values")
        if isinstance(item, dict | list | tuple):
            if level > limits.max_depth:
                raise UserError(f"{label}: nested deeper than {limits.max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            todo.extend((child, level + 1) for child in children)


def read_json_file(path: Path, limits: ReadLimits = DEFAULT_LIMITS, *, what: str = "JSON file") -> Any:
    """A bounded JSON file (see `read_text_file` and `load_json`)."""
    return load_json(read_text_file(path, limits, what=what), str(path), limits)


__all__ = [
    "C_LOADER",
    "DEFAULT_LIMITS",
    "EVENT_LIMITS",
    "ReadLimits",
    "check_structure",
    "check_text_size",
    "compose_yaml",
    "construct_yaml",
    "count_expanded",
    "decode_utf8",
    "load_json",
    "load_yaml_value",
    "read_json_file",
    "read_text_file",
]
