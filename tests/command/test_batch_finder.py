"""The Trainer's own batch-size finder, switched on under gpuwarden, is said at submit: the two
cannot both act, and with the finder the effective batch shrinks unseen."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.command.batch_finder import FINDER_CODE, batch_finder_warning
from gpuwarden.core.command.complete import complete_submitted
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from tests.command.test_help_check import LIGHTNING_HELP, Runner

BASE = ["python", "train.py", "--per_device_train_batch_size", "8", "--output_dir", "out"]


def _spec(argv: list[str], tmp_path: Path, **command: object) -> RunSpec:
    return spec_from_mapping(
        {"name": "ft", "kind": "command", "command": {"argv": argv, "cwd": str(tmp_path), **command}}
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--auto_find_batch_size"], "--auto_find_batch_size"),
        (["--auto-find-batch-size"], "--auto-find-batch-size"),
        (["--auto_find_batch_size=True"], "--auto_find_batch_size"),
        (["--auto_find_batch_size", "true", "--seed", "1"], "--auto_find_batch_size"),
        (["--auto_find_batch_size", "False"], None),
        (["--auto_find_batch_size=0"], None),
        (["--seed", "1"], None),
    ],
)
def test_the_flag_as_users_write_it(tmp_path: Path, extra: list[str], named: str | None) -> None:
    said = batch_finder_warning(_spec([*BASE, *extra], tmp_path))
    if named is None:
        assert said is None
    else:
        assert said is not None and said.startswith(f"{named} lets the Trainer lower the batch itself")
        assert "the effective batch shrinks" in said and "leave it out" in said


@pytest.mark.parametrize(("value", "said"), [("true", True), ("false", False), ('"yes"', True)])
def test_the_setting_in_an_args_file(tmp_path: Path, value: str, said: bool) -> None:
    args = tmp_path / "args.yaml"
    args.write_text(f"per_device_train_batch_size: 8\nauto_find_batch_size: {value}\n")
    line = batch_finder_warning(_spec(["python", "train.py", str(args)], tmp_path, config_file=str(args)))
    assert (line is not None and line.startswith("auto_find_batch_size: true in args.yaml")) is said


def test_a_submit_says_it_beside_what_the_scripts_help_says(tmp_path: Path) -> None:
    argv = ["python", "train.py", "--batch_size", "4", "--auto_find_batch_size"]
    spec = _spec(argv, tmp_path, framework="lightning")
    read_later = complete_submitted(spec, {}, defer_help=True)
    assert read_later.help is not None and [c for c, _ in read_later.warnings] == [FINDER_CODE]
    read_now = complete_submitted(spec, {}, help_runner=Runner(LIGHTNING_HELP))
    assert FINDER_CODE in [c for c, _ in read_now.warnings]
