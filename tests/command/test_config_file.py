"""The attempt's copy of a user's config file: only the knobs' keys change, formatting kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.core.command.config_file import load_config, unified_diff
from gpuwarden.core.errors import UserError

YAML_TEXT = """\
# training setup for a 12 GB card
training:
    batch_size: 4        # micro-batch
    gradient_accumulation_steps: 4
    optimizer: "adamw"   # quoted on purpose
    schedule: [1, 2, 3]
data:
    loading:
        max_length: 2048
        files:
          - a.jsonl
          - b.jsonl
"""


def _changed_lines(old: str, new: str) -> list[str]:
    diff = unified_diff(old, new, "a", "b").splitlines()
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_yaml_keeps_comments_order_quotes_and_indent(tmp_path: Path) -> None:
    path = tmp_path / "default.yaml"
    path.write_text(YAML_TEXT)
    doc = load_config(path)
    assert doc.get("training.batch_size") == 4
    assert doc.get("data.loading.files.1") == "b.jsonl"
    doc.set("training.batch_size", 1)
    doc.set("training.gradient_accumulation_steps", 16)
    doc.set("data.loading.max_length", 1024)
    out = doc.dump()
    assert _changed_lines(YAML_TEXT, out) == [
        "-    batch_size: 4        # micro-batch",
        "-    gradient_accumulation_steps: 4",
        "+    batch_size: 1        # micro-batch",
        "+    gradient_accumulation_steps: 16",
        "-        max_length: 2048",
        "+        max_length: 1024",
    ]
    assert path.read_text() == YAML_TEXT  # only ever read


LIGHTNING_CLI_YAML = """\
# trainer settings
trainer:
  max_steps: 12
  accumulate_grad_batches: 1
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        every_n_train_steps: 4
data:
  batch_size: 64   # per device
"""
FLUSH_LIST_YAML = """\
training:
  batch_size: 64
  files:
  - a.jsonl
  - b.jsonl
"""
LIST_OF_MAPPINGS_YAML = """\
stages:
- training:
    batch_size: 64
  name: warmup
"""


@pytest.mark.parametrize(
    ("text", "key", "changed"),
    [
        (
            LIGHTNING_CLI_YAML,
            "data.batch_size",
            ["-  batch_size: 64   # per device", "+  batch_size: 32   # per device"],
        ),
        (FLUSH_LIST_YAML, "training.batch_size", ["-  batch_size: 64", "+  batch_size: 32"]),
        (
            LIST_OF_MAPPINGS_YAML,
            "stages.0.training.batch_size",
            ["-    batch_size: 64", "+    batch_size: 32"],
        ),
    ],
    ids=["nested-keys-by-2-lists-by-4", "lists-flush-with-their-key", "a-list-of-mappings"],
)
def test_yaml_whose_lists_and_mappings_indent_differently_changes_one_line(
    tmp_path: Path, text: str, key: str, changed: list[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    doc = load_config(path)
    doc.set(key, 32)
    assert _changed_lines(text, doc.dump()) == changed


def test_toml_and_json_keep_their_layout(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("# run\n[training]\nbatch_size = 8  # micro\nlr = 1e-4\n\n[data]\nmax_length = 512\n")
    doc = load_config(toml)
    doc.set("training.batch_size", 2)
    assert _changed_lines(toml.read_text(), doc.dump()) == [
        "-batch_size = 8  # micro",
        "+batch_size = 2  # micro",
    ]

    js = tmp_path / "args.json"
    js.write_text('{\n    "output_dir": "out",\n    "per_device_train_batch_size": 8,\n    "seed": 0\n}\n')
    doc = load_config(js)
    doc.set("per_device_train_batch_size", 4)
    doc.set("gradient_accumulation_steps", 2)  # a key the file did not have is added at the end
    assert _changed_lines(js.read_text(), doc.dump()) == [
        '-    "per_device_train_batch_size": 8,',
        '-    "seed": 0',
        '+    "per_device_train_batch_size": 4,',
        '+    "seed": 0,',
        '+    "gradient_accumulation_steps": 2',
    ]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "a: [1,\n", r"bad.yaml:2:1: YAML syntax error: did not find expected node content"),
        ("bad.json", "{", "not valid JSON"),
        ("bad.toml", "a = ", "not valid TOML"),
        ("open.toml", "x = [\n", r"not valid TOML \(Invalid value \(at end of document\)\)"),
        ("list.yaml", "- 1\n", "the top level must be a mapping"),
        ("c.ini", "a=1", "config files are .yaml, .yml, .json or .toml"),
    ],
)
def test_bad_files_are_one_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)


def test_a_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"command\.config_file: .*nope\.yaml: no such file — check the path"):
        load_config(tmp_path / "nope.yaml")


LEGIT_TOML = '''\
# brackets, commas, dots and = inside strings and comments are text, not structure
title = "a [b, c] = {d.e.f}"  # [x.y.z] = 1, 2, 3
path = 'C:\\\\data\\\\[raw].v1'
notes = """
[[not.a.table]]
k = [1, 2, 3]
"""
[model.encoder]
layers = [[1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5, 15.5, 16.5,
  17.5, 18.5, 19.5, 20.5, 21.5, 22.5, 23.5, 24.5, 25.5, 26.5, 27.5, 28.5, 29.5, 30.5, 31.5, 32.5,
  33.5, 34.5, 35.5, 36.5, 37.5, 38.5, 39.5, 40.5, 41.5, 42.5, 43.5, 44.5, 45.5, 46.5, 47.5, 48.5,
  49.5, 50.5, 51.5, 52.5, 53.5, 54.5, 55.5, 56.5, 57.5, 58.5, 59.5, 60.5, 61.5, 62.5, 63.5, 64.5,
  65.5, 66.5]]
optim.lr = 1e-4
[[data.sources]]
name = "a"
'''


def test_toml_structure_in_strings_and_rows_of_decimals_is_not_nesting(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(LEGIT_TOML)
    doc = load_config(path)
    assert doc.get("model.encoder.optim.lr") == 1e-4
    assert doc.get("title") == "a [b, c] = {d.e.f}"
    assert len(doc.get("model.encoder.layers.0")) == 66


def _alias_bomb() -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("deep.toml", "a = " + "[" * 100_000, "nested deeper than 64 levels — flatten it"),
        ("deep-table.toml", "[" + ".".join(["t"] * 100_000) + "]\n", "nested deeper than 64 levels"),
        ("deep-key.toml", ".".join(["k"] * 70) + " = 1\n", "nested deeper than 64 levels"),
        ("wide.toml", "a = [" + ",".join(["1"] * 20_000) + "]\n", "more than 10000 values"),
        ("deep.json", '{"a": ' + "[" * 100_000, "JSON nested deeper than 64 levels"),
        ("wide.json", '{"a": [' + ",".join(["1"] * 20_000) + "]}", "more than 10000 values"),
        ("deep.yaml", "a: " + "{b: " * 50_000, "nested deeper than 64 levels"),
        ("bomb.yaml", _alias_bomb(), "aliases expand to more than 10000 values"),
    ],
)
def test_hostile_structure_is_refused_before_the_round_trip_parsers(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(path))


def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path: Path) -> None:
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # opened for reading, a FIFO with no writer would block for good
    big = tmp_path / "big.json"
    big.write_bytes(b'{"a": "' + b"x" * (2 << 20) + b'"}')
    for path, message in (
        (zero, "not a regular file"),
        (fifo, "not a regular file"),
        (big, "larger than 1 MiB"),
    ):
        with pytest.raises(UserError, match=f"command.config_file: {path}: {message}"):
            load_config(path)
