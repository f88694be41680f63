"""What `gpuwarden run` tells a user at submit about how a restart would resume: one line on
stderr and a `warning` event, never a refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.daemon.conftest import DaemonHandle, wait_for

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


def _lightning_run(
    gw: DaemonHandle, folder: Path, name: str, script: list[str], *flags: str
) -> subprocess.CompletedProcess[str]:
    """`gpuwarden run --framework lightning [FLAGS] -- SCRIPT…` from `folder`."""
    return gw.cli(
        "run", "--gpus", "0", "--name", name, "--framework", "lightning", *flags, "--", *script, cwd=folder
    )


def test_a_preset_flag_the_scripts_help_does_not_list_is_left_out(gw: DaemonHandle, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(NO_CKPT_FLAG))
    script = [sys.executable, "train.py", "--batch_size", "4"]
    done = _lightning_run(gw, tmp_path, "no-flag", script, "--follow")
    assert done.returncode == 0, done.stderr
    run_id = gw.cli_json("show", "no-flag")["id"]
    # Read beside an attempt this short, the help can be recorded after the run ended (and `run
    # --follow` returned): wait for its warning rather than for the attempt.
    (warning,) = wait_for(lambda: _warnings(gw, run_id), "the help's warning")
    assert warning["code"] == "resume_flag_missing"
    shown = gw.cli("show", run_id, env={"COLUMNS": "1000"}).stdout
    assert f"warning:  {warning['message']}" in shown  # for whoever looks later
    assert warning["message"].startswith(
        f"`{Path(sys.executable).name} train.py --help` does not list --ckpt_path"
    )
    detail = gw.cli_json("show", run_id)
    assert detail["spec"]["command"]["resume_flag"] is False
    assert "--ckpt_path" not in detail["spec"]["command"]["argv"]


# The Trainer's batch and resume flags, but no --gradient_accumulation_steps.
NO_ACCUM_FLAG = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--output_dir")
    parser.add_argument("--resume_from_checkpoint")
    print("trained with", vars(parser.parse_args()))
"""


def test_a_script_without_the_accumulation_flag_runs_and_is_told_what_a_retune_cannot_do(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(NO_ACCUM_FLAG))
    script = [sys.executable, "train.py", "--per_device_train_batch_size", "8", "--output_dir", "out"]
    done = gw.cli(
        "run",
        "--gpus",
        "0",
        "--name",
        "no-accum",
        "--framework",
        "accelerate",
        "--follow",
        "--",
        *script,
        cwd=tmp_path,
    )
    # Accumulation 1 is the script's own default: nothing is added while it holds, so nothing refused.
    assert done.returncode == 0, done.stderr
    run_id = gw.cli_json("show", "no-accum")["id"]
    assert "unrecognized arguments" not in gw.cli("logs", run_id, "--stderr").stdout
    (warning,) = wait_for(lambda: _warnings(gw, run_id), "the help's warning")
    assert warning["code"] == "knob_flag_missing"
    assert warning["message"] == (
        f"`{Path(sys.executable).name} train.py --help` does not list --gradient_accumulation_steps, so a "
        "retune cannot keep the effective batch with a smaller micro-batch and tries the policy's other "
        "steps — give the script a --gradient_accumulation_steps flag, or name the one it has: "
        "--role accum_steps=NAME"
    )
    command = gw.cli_json("show", run_id)["spec"]["command"]
    assert command["roles"].get("accum_steps") is None  # a retune leaves the accumulation at 1
    assert command["resume_flag"] is True  # the help lists --resume_from_checkpoint


# A script whose help comes only once its first attempt has started: read at submit, in front of
# the attempt, the help would never come (the submit would say it did not finish); read beside it,
# it lists no --ckpt_path. Its first attempt writes a checkpoint and fails with 7, restarted at
# once: started before the help is read, the restart would pass `--ckpt_path ckpt/step-1.ckpt`,
# which the script refuses — so it waits for the help, and runs without the flag.
HELP_AFTER_START = """
    import argparse, os, sys, time
    if "--help" in sys.argv:
        for _ in range(6000):  # a bound for a test gone wrong, far beyond any machine's load
            if os.path.exists("started"):
                break
            time.sleep(0.05)
        time.sleep(1.0)  # the first attempt has failed by now: its restart waits for this help
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.parse_args()
    if not os.path.exists("started"):
        os.makedirs("ckpt", exist_ok=True)
        open("ckpt/step-1.ckpt", "w").close()
        open("started", "w").close()
        sys.exit(7)
"""


def test_the_scripts_help_is_read_beside_the_first_attempt_and_a_restart_waits_for_it(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(HELP_AFTER_START))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""
            name: help-beside
            kind: command
            resources: {{gpus: 0}}
            restart: {{on: [{{exit_code: [7]}}], max: 1, backoff: 0}}
            command:
              cwd: {tmp_path}
              framework: lightning
              argv: [{sys.executable}, train.py, --batch_size, "4"]
              checkpoints: {{glob: "ckpt/*.ckpt"}}
            """
        )
    )
    done = gw.cli("run", str(spec), "--follow", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    detail = gw.cli_json("show", "help-beside")
    assert detail["state"] == "succeeded"
    (warning,) = _warnings(gw, detail["id"])
    assert warning["code"] == "resume_flag_missing", warning["message"]
    first, second = (a["prepared"]["argv"] for a in detail["attempts"])
    assert "--ckpt_path" not in first and "--ckpt_path" not in second
    assert detail["spec"]["command"]["resume_flag"] is False


# Its help answers once `release` exists; its first attempt runs until `finish` exists.
HELP_ON_RELEASE = """
    import argparse, os, sys, time
    gate = "release" if "--help" in sys.argv else "finish"
    for _ in range(6000):  # a bound for a test gone wrong, far beyond any machine's load
        if os.path.exists(gate):
            break
        time.sleep(0.05)
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulate_grad_batches", type=int, default=1)
    parser.parse_args()
"""


def test_a_daemon_killed_while_the_help_is_read_reads_it_again_when_restarted(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(HELP_ON_RELEASE))
    script = [sys.executable, "train.py", "--batch_size", "4"]
    done = _lightning_run(gw, tmp_path, "killed-reading", script)
    assert done.returncode == 0, done.stderr
    detail = gw.wait_state("killed-reading", ("running",))
    pending = Path(detail["run_dir"]) / "help-pending.json"
    wait_for(pending.exists, "the help being read")
    gw.kill9()
    gw.start()
    (tmp_path / "release").touch()  # both helps answer: the killed daemon's and the new one's
    warnings = wait_for(lambda: _warnings(gw, detail["id"]), "the help's verdict, read again")
    assert [w["code"] for w in warnings] == ["resume_flag_missing"]
    assert gw.cli_json("show", detail["id"])["spec"]["command"]["resume_flag"] is False
    wait_for(lambda: not pending.exists(), "the pending note removed")
    (tmp_path / "finish").touch()
    final = gw.wait_state(detail["id"])
    assert final["state"] == "succeeded", final["message"]  # the adopted attempt ran on
