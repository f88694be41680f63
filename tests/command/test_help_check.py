"""A preset's resume flag is asked of the script's own `--help` before it is counted on: the
decision with a substituted runner, and the real runner's bounds on real processes."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.command.complete import complete_command, complete_submitted
from gpuwarden.core.command.help_check import (
    MISSING_CODE,
    UNCHECKED_CODE,
    HelpAsk,
    HelpOutput,
    ask_resume_flag,
    check_resume_flag,
    help_argv,
    judge_help,
    lists_flag,
    run_help,
    without_flag,
)
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping

LIGHTNING_HELP = "usage: train.py [-h] [--batch_size B] [--ckpt_path CKPT_PATH]\n"
NO_FLAG_HELP = "usage: train.py [-h] [--batch_size B] [--ckpt_path_other X]\n"


class Runner:
    """A `--help` that prints `text` (or fails with `problem`), remembering how it was asked."""

    def __init__(self, text: str | None, problem: str = "") -> None:
        self.out = HelpOutput(text, problem)
        self.calls: list[tuple[list[str], dict[str, str], Path, float]] = []

    def __call__(self, argv: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float) -> HelpOutput:
        self.calls.append((argv, dict(env), cwd, timeout_s))
        return self.out


def _spec(argv: list[str], tmp_path: Path, framework: str = "lightning", **command: Any) -> RunSpec:
    return spec_from_mapping(
        {
            "name": "own",
            "kind": "command",
            "env": {"OMP_NUM_THREADS": "1"},
            "command": {"argv": argv, "framework": framework, "cwd": str(tmp_path), **command},
        }
    )


def test_a_help_that_lists_the_flag_keeps_it(tmp_path: Path) -> None:
    spec = _spec(["{python}", "train.py", "--batch_size", "4"], tmp_path)
    runner = Runner(LIGHTNING_HELP)
    checked = check_resume_flag(spec, {"PATH": "/bin", "GPUWARDEN_EVENTS_FILE": "/x"}, runner)
    assert checked.spec is spec and checked.message is None
    ((argv, env, cwd, timeout),) = runner.calls
    assert argv == [sys.executable, "train.py", "--help"] and cwd == tmp_path and timeout == 20.0
    # The run's environment, its spec's variables, no GPU, no gpuwarden variable for its SDK.
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    assert complete_command(checked.spec).command.argv[-2:] == ["--ckpt_path", "{resume_from?}"]  # type: ignore[union-attr]


def test_a_help_without_the_flag_turns_it_off_and_says_what_to_do(tmp_path: Path) -> None:
    spec = _spec(["python", "train.py", "--batch_size", "4"], tmp_path)
    checked = check_resume_flag(spec, {}, Runner(NO_FLAG_HELP))
    assert checked.code == MISSING_CODE and checked.spec.command is not None
    assert checked.spec.command.resume_flag is False
    assert checked.message == (
        "`python train.py --help` does not list --ckpt_path, so the lightning preset passes no checkpoint "
        "and a restart starts from the beginning — load it with sdk.resume_from() in the script "
        "(trainer.fit(model, ckpt_path=sdk.resume_from())), or give the script a --ckpt_path flag"
    )
    completed = complete_command(checked.spec)
    assert completed.command is not None and "--ckpt_path" not in completed.command.argv
    assert complete_command(completed) == completed  # stays off when the spec is completed again


def test_a_help_that_cannot_be_read_keeps_the_flag_and_says_it_was_not_checked(tmp_path: Path) -> None:
    spec = _spec(["python", "-m", "mypkg.train", "fit", "--batch_size", "4"], tmp_path)
    runner = Runner(None, "exited with status 1")
    checked = check_resume_flag(spec, {}, runner)
    assert runner.calls[0][0] == ["python", "-m", "mypkg.train", "fit", "--help"]
    assert checked.spec is spec and checked.code == UNCHECKED_CODE
    assert checked.message is not None and checked.message.startswith(
        "--ckpt_path {resume_from?} is added unchecked: `python -m mypkg.train fit --help` exited with status 1"
    )
    assert "set command.resume_flag: false" in checked.message


@pytest.mark.parametrize(
    ("argv", "framework", "extra"),
    [
        (["python", "train.py", "--batch_size", "4"], "none", {}),  # no preset: nothing to add
        (["python", "train.py", "--ckpt_path", "{resume_from?}"], "lightning", {}),  # the user's own
        (["python", "train.py"], "lightning", {"resume_flag": False}),  # turned off already
    ],
)
def test_no_help_is_run_where_no_preset_flag_would_be_added(
    tmp_path: Path, argv: list[str], framework: str, extra: dict[str, Any]
) -> None:
    runner = Runner(NO_FLAG_HELP)
    spec = _spec(argv, tmp_path, framework, **extra)
    assert check_resume_flag(spec, {}, runner).spec is spec and runner.calls == []


def test_an_args_file_gets_the_key_not_the_flag_so_no_help_is_run(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{"per_device_train_batch_size": 8, "output_dir": "out"}')
    runner = Runner(NO_FLAG_HELP)
    spec = _spec(["python", "ft.py", str(args)], tmp_path, "transformers", config_file=str(args))
    assert check_resume_flag(spec, {}, runner).message is None and runner.calls == []


def test_the_help_is_not_run_without_a_known_program(tmp_path: Path) -> None:
    runner = Runner(LIGHTNING_HELP)
    placeholder = check_resume_flag(_spec(["python", "{run_dir}/train.py"], tmp_path), {}, runner)
    assert runner.calls == []
    assert placeholder.code == UNCHECKED_CODE
    assert "the program is known only once it starts" in str(placeholder.message)


def test_help_argv_takes_the_program_and_its_subcommand() -> None:
    assert help_argv(["python", "-u", "train.py", "--lr", "1"]) == ["python", "-u", "train.py", "--help"]
    assert help_argv(["./train", "--lr", "1"]) == ["./train", "--help"]
    assert help_argv(["python", "main.py", "fit", "--config", "c.yaml"]) == [
        "python",
        "main.py",
        "fit",
        "--help",
    ]
    assert help_argv(["python", "main.py", "{mode}"]) == ["python", "main.py", "--help"]
    assert help_argv(["{prog}", "--lr", "1"]) is None


def test_only_the_flag_itself_counts() -> None:
    assert lists_flag("  --ckpt_path CKPT_PATH  a checkpoint", "--ckpt_path")
    assert lists_flag("[--ckpt_path=PATH]", "--ckpt_path")
    assert not lists_flag("--ckpt_path_other  --x-ckpt_path", "--ckpt_path")


def test_a_submit_says_one_line_for_the_missing_flag(tmp_path: Path) -> None:
    spec = _spec(["python", "train.py", "--batch_size", "4"], tmp_path)
    submitted = complete_submitted(spec, {}, help_runner=Runner(NO_FLAG_HELP))
    # The preset still looks for checkpoints, which now reach nothing: said once, by the flag's line.
    assert [code for code, _ in submitted.warnings] == [MISSING_CODE]


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_the_real_runner_reads_an_argparse_help(tmp_path: Path) -> None:
    _script(
        tmp_path,
        "import argparse; p = argparse.ArgumentParser(); p.add_argument('--ckpt_path'); p.parse_args()",
    )
    out = run_help([sys.executable, "script.py", "--help"], {}, tmp_path, 20)
    assert out.text is not None and lists_flag(out.text, "--ckpt_path")


def test_the_help_runs_at_the_lowest_priority_so_the_attempt_beside_it_starts_first(tmp_path: Path) -> None:
    # The priority is set just after the start: the script waits for it (up to 5 s) and says it.
    _script(
        tmp_path,
        "import os, time\n"
        "end = time.monotonic() + 5\n"
        "while os.getpriority(os.PRIO_PROCESS, 0) != 19 and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "print('nice', os.getpriority(os.PRIO_PROCESS, 0))\n",
    )
    out = run_help([sys.executable, "script.py", "--help"], {}, tmp_path, 20)
    assert out.text is not None and out.text.split() == ["nice", "19"]


@pytest.mark.parametrize(
    ("body", "timeout", "problem"),
    [
        ("import time; time.sleep(30)", 1, "did not finish within 1 s"),
        (
            "import sys; sys.stdout.write('x' * (3 << 20)); sys.stdout.flush()",
            20,
            "printed more than 1024 KiB",
        ),
        ("import sys; print('no such option'); sys.exit(2)", 20, "exited with status 2"),
    ],
)
def test_the_real_runner_is_bounded(tmp_path: Path, body: str, timeout: float, problem: str) -> None:
    _script(tmp_path, body)
    out = run_help([sys.executable, "script.py", "--help"], {}, tmp_path, timeout)
    assert out.text is None and out.problem == problem


def test_the_real_runner_says_when_the_program_is_not_there(tmp_path: Path) -> None:
    out = run_help([str(tmp_path / "nothing-here"), "--help"], {}, tmp_path, 5)
    assert out.text is None and out.problem.startswith("could not start: ")


def test_without_flag_takes_back_the_pair_the_preset_appended() -> None:
    spec = spec_from_mapping(
        {
            "name": "x",
            "kind": "command",
            "command": {
                "argv": [
                    "python",
                    "train.py",
                    "--ckpt_path",
                    "{resume_from?}",
                    "--x",
                    "--ckpt_path",
                    "{resume_from?}",
                ],
                "framework": "lightning",
            },
        }
    )
    off = without_flag(spec, "--ckpt_path")
    assert off.command is not None and off.command.resume_flag is False
    assert off.command.argv == [
        "python",
        "train.py",
        "--ckpt_path",
        "{resume_from?}",
        "--x",
    ]  # the last pair only


def test_the_accumulation_flag_alone_is_asked_when_the_command_passes_its_own_resume(tmp_path: Path) -> None:
    spec = _spec(
        ["{python}", "ft.py", "--per_device_train_batch_size", "8", "--resume", "{resume_from?}"],
        tmp_path,
        framework="transformers",
    )
    ask = ask_resume_flag(spec, {})
    assert isinstance(ask, HelpAsk) and ask.flag == ""  # the user's own --resume is not judged
    completed = complete_command(spec)
    lacking = judge_help(
        completed, ask, HelpOutput("usage: ft.py [--per_device_train_batch_size N] [--resume R]\n")
    )
    # The evaluation's batch is dropped too, without a word: a script that does not evaluate needs none.
    assert lacking.dropped == ("gradient_accumulation_steps", "per_device_eval_batch_size")
    assert lacking.code is None and [code for code, _ in lacking.lines()] == ["knob_flag_missing"]
    assert lacking.spec.command is not None and lacking.spec.command.roles.accum_steps is None
    # Completed again (an edit does so), the spec gets no accumulation role back.
    assert complete_command(lacking.spec).command.roles.accum_steps is None  # type: ignore[union-attr]
    listing = judge_help(
        completed,
        ask,
        HelpOutput("usage: ft.py [--gradient_accumulation_steps G] [--per_device_eval_batch_size E]\n"),
    )
    assert listing.spec is completed and listing.lines() == []


NO_TRAINER_HELP = (
    "usage: train.py [--per_device_train_batch_size N] [--gradient_accumulation_steps G]\n"
    "                [--per_device_eval_batch_size E]\n"
    "                [--checkpointing_steps CHECKPOINTING_STEPS] [--resume_from_checkpoint R]\n"
)


def test_a_loop_on_accelerate_submitted_with_the_trainer_preset_is_told_its_preset(tmp_path: Path) -> None:
    spec = _spec(["{python}", "train.py", "--per_device_train_batch_size", "8"], tmp_path, "transformers")
    completed = complete_command(spec)
    ask = ask_resume_flag(spec, {})
    assert isinstance(ask, HelpAsk)
    checked = judge_help(completed, ask, HelpOutput(NO_TRAINER_HELP))
    assert checked.lines() == [
        (
            "preset_mismatch",
            f"`{Path(sys.executable).name} train.py --help` lists --checkpointing_steps but not --save_steps, "
            "as a loop of its own on Accelerate does: the transformers preset looks for the Trainer's "
            "checkpoint-N folders and a restart would start from the beginning — submit with "
            "--framework accelerate",
        )
    ]
    assert checked.spec is completed  # told, not changed: the flags it lists are all there
    # The right preset, or a Trainer script's help (it lists --save_steps), says nothing.
    right = _spec(["{python}", "train.py", "--per_device_train_batch_size", "8"], tmp_path, "accelerate")
    assert judge_help(complete_command(right), ask, HelpOutput(NO_TRAINER_HELP)).lines() == []
    trainer_help = NO_TRAINER_HELP + "                [--save_steps S]\n"
    assert judge_help(completed, ask, HelpOutput(trainer_help)).lines() == []
