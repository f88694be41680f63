"""The attempt's copy of a user's config file: only the knobs' keys change, formatting kept."""

from __future__ import annotations

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
        ("bad.yaml", "a: [1,\n", "not valid YAML"),
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
    with pytest.raises(UserError, match="does not exist — fix the path"):
        load_config(tmp_path / "nope.yaml")
