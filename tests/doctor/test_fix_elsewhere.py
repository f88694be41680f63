"""A spec written to another folder (`doctor --fix OUT`, `tune -o OUT`) runs as the original
would: its relative paths are rewritten to start from where it is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuwarden.core.config.resolve import resolve_relative_paths
from gpuwarden.core.config.spec import load_spec
from gpuwarden.core.tune.write import write_tuned_spec
from tests.doctor.test_cli import gw

LM_SPEC = """\
# a causal LM, its model and texts beside it
name: lm
kind: train
resources: {gpus: 0}
train:
  task: causal_lm
  model: ./models/lm   # saved with save_pretrained()
  data: texts.jsonl
  amp: true
"""

COMMAND_SPEC = """\
name: mine
kind: command
resources: {gpus: 0}
command:
  argv: [./train.sh, --config, conf/x.yaml]
"""


def _project(root: Path) -> Path:
    """A spec's folder with what it names: a model directory and a text file."""
    (root / "models" / "lm").mkdir(parents=True)
    (root / "models" / "lm" / "config.json").write_text("{}")
    (root / "texts.jsonl").write_text('{"text": "hello"}\n')
    (root / "lm.yaml").write_text(LM_SPEC)
    (root / "train.sh").write_text("#!/bin/sh\n")
    (root / "mine.yaml").write_text(COMMAND_SPEC)
    return root


def _resolved(path: Path) -> dict[str, Any]:
    """The spec as a run of it reads it: every relative path joined to its folder (normalised
    here, so that `a/../b` and `b` compare equal)."""
    spec = resolve_relative_paths(load_spec(path), path.parent).model_dump(mode="json")
    for section in ("train", "command"):
        for key, value in (spec.get(section) or {}).items():
            if key in ("model", "data", "cwd") and isinstance(value, str):
                spec[section][key] = os.path.normpath(value)
    return spec


def test_doctor_fix_to_another_folder_names_the_same_files(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    out = tmp_path / "other" / "dir" / "fixed.yaml"
    out.parent.mkdir(parents=True)
    body = json.loads(gw("doctor", str(project / "lm.yaml"), "--fix", str(out), "--json").stdout)
    assert body["fixed"]["changes"]["train.model"] == "../../project/models/lm"
    assert body["fixed"]["notes"] == [
        f"relative paths rewritten to start from {out.parent}, where this copy is: train.model, train.data"
    ]
    fixed = _resolved(out)
    assert fixed["train"]["model"] == str(project / "models" / "lm")
    assert fixed["train"]["data"] == str(project / "texts.jsonl")
    text = out.read_text()
    assert "model: ../../project/models/lm  # doctor --fix: was ./models/lm" in text  # said where
    assert "# a causal LM, its model and texts beside it" in text  # the user's comments kept
    # The written spec checks clean where it is: no input is missing.
    again = json.loads(gw("doctor", str(out), "--json").stdout)
    assert [f for f in again["findings"] if f["id"] == "missing-input"] == []


def test_doctor_fix_of_a_command_run_keeps_running_in_the_original_folder(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    out = tmp_path / "elsewhere" / "fixed.yaml"
    out.parent.mkdir()
    done = gw("doctor", str(project / "mine.yaml"), "--fix", str(out))
    assert done.returncode == 0, done.stderr
    command = _resolved(out)["command"]
    assert command["cwd"] == str(project)
    assert command["argv"][:2] == ["./train.sh", "--config"]
    again = json.loads(gw("doctor", str(out), "--json").stdout)
    assert [f for f in again["findings"] if f["id"] == "missing-input"] == []


def test_a_tuned_spec_written_elsewhere_names_the_same_files(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    out = tmp_path / "tuned" / "lm.tuned.yaml"
    out.parent.mkdir()
    moved = write_tuned_spec(project / "lm.yaml", out, "train", {"batch_size": 8}, "best: 8 × 1")
    assert moved == {"train.model": "../project/models/lm", "train.data": "../project/texts.jsonl"}
    assert _resolved(out)["train"] == {**_resolved(project / "lm.yaml")["train"], "batch_size": 8}
    # Beside the original, nothing is rewritten.
    assert write_tuned_spec(project / "lm.yaml", project / "t.yaml", "train", {}, "best") == {}
    assert "model: ./models/lm" in (project / "t.yaml").read_text()
