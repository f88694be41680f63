"""`apply_fixes` edits the text: comments, order and style of untouched lines survive."""

from __future__ import annotations

import yaml

from gpuwarden.core.doctor.fix import apply_fixes, render_scalar, with_header

BLOCK = """\
# my run
name: r   # the name
kind: train
train:
  task: image
  amp: false          # meant bf16
  optimizer:
    lr: 0.001
  batch_size: 4
"""


def test_replace_keeps_other_lines_and_notes_the_old_value() -> None:
    out = apply_fixes(BLOCK, {"train.batch_size": 64})
    assert out.splitlines()[:8] == BLOCK.splitlines()[:8]
    assert out.splitlines()[8] == "  batch_size: 64  # doctor --fix: was 4"


def test_insert_into_existing_and_missing_sections() -> None:
    out = apply_fixes(BLOCK, {"train.optimizer.fused": "auto", "train.image.base_channels": 64, "env.A": "1"})
    data = yaml.safe_load(out)
    assert data["train"]["optimizer"] == {"lr": 0.001, "fused": "auto"}
    assert data["train"]["image"] == {"base_channels": 64}
    assert data["env"] == {"A": "1"}
    assert "# the name" in out and "# meant bf16" in out


def test_remove_a_key_with_its_comment_and_a_section_left_empty() -> None:
    out = apply_fixes(BLOCK, {"train.amp": None, "train.optimizer.lr": None})
    assert "amp" not in out and "meant bf16" not in out and "optimizer" not in out
    assert yaml.safe_load(out)["train"] == {"task": "image", "batch_size": 4}


def test_flow_mappings_are_edited_in_place() -> None:
    text = "name: f\nkind: train\ntrain: {task: image, amp: false, optimizer: {fused: false}}\n"
    out = apply_fixes(text, {"train.amp": None, "train.precision": "auto", "train.optimizer.fused": "auto"})
    assert out == "name: f\nkind: train\ntrain: {task: image, optimizer: {fused: auto}, precision: auto}\n"


def test_empty_value_becomes_a_mapping_and_a_file_without_final_newline_is_extended() -> None:
    out = apply_fixes(
        "name: x\ntrain:\n  optimizer:\n  task: image", {"train.optimizer.fused": "auto", "env.B": "2"}
    )
    assert yaml.safe_load(out) == {
        "name": "x",
        "train": {"optimizer": {"fused": "auto"}, "task": "image"},
        "env": {"B": "2"},
    }


def test_scalars_read_back_as_the_same_value() -> None:
    for value in [True, False, 10, 0.5, "auto", "expandable_segments:True", "a #b", "yes", "", "01"]:
        assert yaml.safe_load(f"k: {render_scalar(value)}")["k"] == value


def test_header_says_what_changed() -> None:
    out = with_header("a: 1\n", {"train.amp": None, "train.compile": True}, "x.yaml", ["precision-fp32"])
    assert out.startswith(
        "# Written by `gpuwarden doctor --fix` from x.yaml.\n# Changed:\n#   train.amp: removed\n"
    )
    assert "#   train.compile: true" in out and "# Findings fixed: precision-fp32" in out
