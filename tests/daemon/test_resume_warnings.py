"""What `gpuwarden run` tells a user at submit about how a restart would resume: one line on
stderr and a `warning` event, never a refusal."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.daemon.conftest import DaemonHandle

# Lightning's batch flags but no --ckpt_path, so `--framework lightning` must not add one.
NO_CKPT_FLAG = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.parse_args()
"""


def _warnings(gw: DaemonHandle, run_id: str) -> list[dict[str, Any]]:
    """The run's warnings as `gpuwarden events RUN --json` prints them."""
    return [e for e in gw.cli_json("events", run_id)["events"] if e["type"] == "warning"]


def _run(gw: DaemonHandle, cwd: Path, *words: str) -> tuple[str, str]:
    """`gpuwarden run --gpus 0 WORDS…` in `cwd`: the run's id, and what it printed on stderr."""
    done = gw.cli("run", "--gpus", "0", *words, cwd=cwd)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[0]
    gw.wait_state(run_id)
    return run_id, done.stderr


def test_checkpoints_the_command_passes_nowhere_are_one_warning_line(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    code = "print('training from step 0')"
    run_id, printed = _run(gw, tmp_path, "--checkpoints", "ckpt/*", "--", sys.executable, "-c", code)
    (warning,) = _warnings(gw, run_id)
    assert warning["code"] == "resume_nowhere" and warning["attempt"] is None
    assert printed.strip() == f"warning: {warning['message']}"  # one line
    assert "passes {resume_from} nowhere, so a restart starts from the beginning" in warning["message"]
    assert "e.g. --resume {resume_from?}" in warning["message"]
    assert gw.wait_state(run_id)["state"] == "succeeded"  # told, not refused

    passed, printed = _run(
        gw,
        tmp_path,
        "--checkpoints",
        "ckpt/*",
        "--",
        sys.executable,
        "-c",
        code,
        "--resume",
        "{resume_from?}",
    )
    assert _warnings(gw, passed) == [] and printed == ""


def test_a_preset_flag_the_scripts_help_does_not_list_is_left_out(gw: DaemonHandle, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(NO_CKPT_FLAG))
    script = [sys.executable, "train.py", "--batch_size", "4"]
    run_id, printed = _run(gw, tmp_path, "--framework", "lightning", "--", *script)
    (warning,) = _warnings(gw, run_id)
    assert warning["code"] == "resume_flag_missing" and printed.strip() == f"warning: {warning['message']}"
    assert warning["message"].startswith(
        f"`{Path(sys.executable).name} train.py --help` does not list --ckpt_path"
    )
    detail = gw.cli_json("show", run_id)
    assert detail["spec"]["command"]["resume_flag"] is False
    assert "--ckpt_path" not in detail["spec"]["command"]["argv"]
