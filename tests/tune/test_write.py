"""The tuned spec is the user's file with the tuned values changed: comments and order stay."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuwarden.core.tune.write import write_tuned_spec

SPEC = """\
# My run: comments are part of the file a person keeps.
name: mine
kind: train
autotune: true
train:
  task: image
  batch_size: 2             # micro-batch
  grad_accum_steps: 4       # effective batch 8
  amp: true
"""


def test_tuned_spec_keeps_comments_and_order_and_changes_only_the_knobs(tmp_path: Path) -> None:
    source = tmp_path / "run.yaml"
    source.write_text(SPEC)
    out = tmp_path / "run.tuned.yaml"
    moved = write_tuned_spec(
        source, out, "train",
        {"batch_size": 8, "grad_accum_steps": 1, "precision": "bf16"}, "best: micro-batch 8 × 1",
    )  # fmt: skip
    assert moved == {}  # beside the original: its relative paths hold as they are
    text = out.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# tuned by `gpuwarden tune")
    assert lines[1] == "# best: micro-batch 8 × 1"
    assert "# My run: comments are part of the file a person keeps." in text
    assert "  batch_size: 8             # micro-batch" in lines
    assert "  grad_accum_steps: 1       # effective batch 8" in lines
    data = yaml.safe_load(text)
    assert "autotune" not in data and "amp" not in data["train"]  # contradicted by the tuned values
    assert list(data["train"]) == ["task", "batch_size", "grad_accum_steps", "precision"]
    assert source.read_text() == SPEC  # the user's file is only read
