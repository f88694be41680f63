"""The bounded reader on its own: each limit refused in one located line, aliases never expanded
(line numbers included), JSON and event lines bounded the same way, and the events tail never
stuck behind a runaway line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gpuwarden.core.config.yamlsource import load_yaml_file, parse_yaml
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import decode
from gpuwarden.core.safeload import (
    EVENT_LIMITS,
    ReadLimits,
    check_structure,
    load_json,
    load_yaml_value,
    read_text_file,
)
from gpuwarden.daemon.events_tail import MAX_CHUNK, OVERSIZED, EventsTail

SMALL = ReadLimits(max_bytes=200, max_depth=3, max_values=20)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: " + "x" * 300, "larger than 200 bytes"),
        ("a: {b: {c: {d: 1}}}", "s:1:12: nested deeper than 3 levels"),
        ("a: [" + ", ".join(["1"] * 30) + "]", "more than 20 values"),
        ("a: &a [1, 2, 3, 4]\nb: [*a, *a, *a, *a, *a]", "s:2:4: its aliases expand to more than 20 values"),
        ("a: &a [1]\nb: &b [*a]\nc: [*b]", "s:3:4: its aliases nest deeper than 3 levels"),
    ],
)
def test_each_limit_is_one_located_line(text: str, expected: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_yaml(text, "s", SMALL)
    assert expected in caught.value.message and "\n" not in caught.value.message


def test_aliases_keep_their_values_and_lines_without_being_walked_again() -> None:
    doc = parse_yaml("base: &b {lr: 0.1, steps: 3}\nrun:\n  opt: *b\n  more: [*b, *b]\n", "spec.yaml")
    assert doc.data["run"]["opt"] == {"lr": 0.1, "steps": 3}
    assert doc.data["run"]["more"][1] is doc.data["base"]  # shared, as PyYAML builds it
    assert doc.where(("run", "opt")) == "spec.yaml:3"
    assert doc.where(("base", "lr")) == "spec.yaml:1"
    # The alias's own children are reached only through the anchor's place.
    assert ("run", "opt", "lr") not in doc.lines and doc.where(("run", "opt", "lr")) == "spec.yaml:3"


def test_merge_keys_still_work() -> None:
    doc = parse_yaml("defaults: &d {a: 1, b: 2}\nthis:\n  <<: *d\n  b: 3\n", "s")
    assert doc.data["this"] == {"a": 1, "b": 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: !!python/object/apply:os.system ['true']", "gpuwarden reads plain YAML values only"),
        ("a: &x [*x]", "an alias refers to the value that contains it"),
        ("a: *missing", "alias *missing names no anchor"),
        ("a: &x 1\nb: &x 2", "anchor &x is defined twice"),
        ("a: 1\n---\nb: 2", "a second YAML document"),
        ("a: [1, 2", "YAML syntax error"),
    ],
)
def test_what_yaml_cannot_hold_here(text: str, expected: str) -> None:
    with pytest.raises(UserError, match=re.escape(expected)):
        parse_yaml(text, "s")


def test_values_typed_into_a_form() -> None:
    assert load_yaml_value("4", "batch") == 4
    assert load_yaml_value("fp16", "precision") == "fp16"
    with pytest.raises(UserError):
        load_yaml_value("[" * 1000, "batch")


def test_files_that_are_not_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening a FIFO must not wait for a writer
    for path, expected in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (tmp_path, "is a directory"),
        (tmp_path / "missing.yaml", "no such file"),
    ):
        with pytest.raises(UserError, match=expected):
            read_text_file(path, what="YAML file")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" * 300_000)
    with pytest.raises(UserError, match="larger than 1 MiB"):
        load_yaml_file(big)


def test_json_limits() -> None:
    assert load_json('{"a": [1, 2]}', "j") == {"a": [1, 2]}
    for text, expected in (
        ("[" * 5000, "nested deeper than 64"),
        ("[" * 100 + "]" * 100, "nested deeper than 64"),
        ("[" + ",".join(["1"] * 20_000) + "]", "more than 10000 values"),
        ("{", "not valid JSON"),
    ):
        with pytest.raises(UserError, match=expected):
            load_json(text, "j")
    deep: object = 1
    for _ in range(100):
        deep = {"x": deep}
    with pytest.raises(UserError, match="nested deeper"):
        check_structure(deep, "spec")


def test_event_lines_are_bounded() -> None:
    assert decode('{"type": "progress", "ts": 1, "step": 2}') == {"type": "progress", "ts": 1, "step": 2}
    nested = '{"type": "progress", "ts": 1, "x": ' + "[" * 40 + "]" * 40 + "}"
    assert decode(nested) is None  # deeper than EVENT_LIMITS.max_depth
    assert EVENT_LIMITS.max_depth < 40


def test_events_tail_skips_a_runaway_line_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = json.dumps({"type": "progress", "ts": 1, "step": 1})
    path.write_bytes(b"x" * (MAX_CHUNK * 2 + 10) + b"\n" + good.encode() + b"\n")
    tail = EventsTail(path)
    lines: list[str] = []
    for _ in range(10):
        chunk = tail.read()
        if chunk is None:
            break
        lines += chunk.lines
        tail.commit(chunk.end_offset)
    assert lines == [OVERSIZED, good]
    assert tail.offset == path.stat().st_size
