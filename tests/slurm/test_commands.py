"""Slurm's tools missing or not answering: one line each, no Slurm needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.slurm.commands import Answer, refusal, run_tool
from gpuwarden.slurm.scheduler import submit


def test_no_sbatch_on_path_says_where_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nexec true\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError) as caught:
        submit(script)
    assert caught.value.message == (
        "sbatch not found on PATH: run this where Slurm's client commands are installed"
        " (a login or compute node), or add their directory to PATH"
    )


def test_a_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^no batch script at .*nothing\.sbatch: write it first"):
        submit(tmp_path / "nothing.sbatch")


def test_a_tool_that_does_not_answer_is_stopped_in_time() -> None:
    with pytest.raises(UserError, match=r"^sleep did not answer within 0\.2 s: check that slurmctld is up"):
        run_tool(["sleep", "5"], timeout_s=0.2)


def test_slurms_several_lines_become_one_without_prefixes_and_hints() -> None:
    said = Answer(
        1,
        "",
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    assert refusal("sbatch", said) == (
        "invalid partition specified: nope; Batch job submission failed: Invalid partition name specified"
    )
    hint = Answer(1, "", "sbatch: unrecognized option '--x'\nTry \"sbatch --help\" for more information\n")
    assert refusal("sbatch", hint) == "unrecognized option '--x'"
    assert refusal("sbatch", Answer(3, "", "")) == "exit status 3"
