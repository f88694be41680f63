"""`gpuwarden run WORD`: a lone argument is a spec file or a program; anything else is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwarden.client import NOT_RUNNING
from gpuwarden.core.config.spec import spec_from_mapping
from tests import preloaded


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))}
    env |= {"XDG_RUNTIME_DIR": str(cwd / "runtime"), "XDG_STATE_HOME": str(cwd / "state")}
    return preloaded.run([sys.executable, "-m", "gpuwarden", "run", *args], cwd=cwd, env=env)


@pytest.mark.parametrize(
    ("word", "says"),
    [
        ("/dev/zero", "/dev/zero: not a regular file"),
        (".", ".: is a directory, not a YAML file"),
        ("train.py", "train.py is a Python script: run it with `gpuwarden run -- python train.py`"),
        ("no-such-thing", "no-such-thing: no such spec file or program"),
        ("missing.yaml", "missing.yaml: no such file"),
        # refused here, naming the file, rather than by the API naming a request field
        ("big.yaml", "big.yaml: larger than 256 KiB, the limit for a YAML file"),
    ],
)
def test_a_lone_word_that_is_neither_is_one_line(tmp_path: Path, word: str, says: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "big.yaml").write_text("name: a\nkind: command\ncommand: {argv: ['true']}\n" + "#" * 300_000)
    done = _run(word, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"gpuwarden: {says}") and done.stderr.count("\n") == 1, done.stderr


def test_a_program_on_the_path_is_a_command(tmp_path: Path) -> None:
    printed = _run("--print-spec", "--", "true", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "kind: command" in printed.stdout and "- 'true'" in printed.stdout
    alone = _run("true", cwd=tmp_path)  # submitted as a command: only the missing daemon stops it
    assert alone.stderr.strip() == f"gpuwarden: {NOT_RUNNING}"


@pytest.mark.parametrize(
    ("flag", "says"), [("--warm-restart", "warm_restart: true"), ("--cold-restart", "warm_restart: false")]
)
def test_a_restart_start_flag_sets_it_in_the_spec(tmp_path: Path, flag: str, says: str) -> None:
    printed = _run(flag, "--print-spec", "--", "python", "train.py", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert says in printed.stdout
    default = _run("--print-spec", "--", "python", "train.py", cwd=tmp_path)
    assert "warm_restart" not in default.stdout  # auto: the default, left out
    both = _run("--warm-restart", "--cold-restart", "--print-spec", "--", "python", "t.py", cwd=tmp_path)
    assert both.returncode != 0
    assert both.stderr.strip() == "gpuwarden: --warm-restart and --cold-restart: give one of them"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["a.yaml", "b.yaml"], "one spec file at a time: gpuwarden run a.yaml (got 2 arguments;"),
        (["a.yaml", "--print-spec"], "--print-spec: only for your own program"),
        (["--memory-limit", "1GiB", "a.yaml"], "--memory-limit: only for your own program"),
        (["--gpus", "-1", "--print-spec", "--", "true"], "--gpus: '-1' names no GPU"),
        (["--gpus", "0,0", "--print-spec", "--", "true"], "--gpus: '0' is listed twice"),
        (
            ["--memory-limit", "0", "--print-spec", "--", "true"],
            "--memory-limit: 0 B leaves no room to start a process",
        ),
        # the fix in the flags' own words, not a spec file's `knobs:`
        (
            ["--role", "micro_batch=bs", "--print-spec", "--", "true"],
            "--role micro_batch=bs: no knob 'bs' and no --bs VALUE in the command — add --bs N (the value "
            "the program uses now) to the command, name a flag it passes, or give a knob (--knob bs=VALUE) "
            "and write {bs} in the command",
        ),
        (
            ["--role", "micro_batch=--", "--print-spec", "--", "python", "t.py", "--batch-size", "4"],
            "--role micro_batch=--: name a knob, a flag of the command or a config key (e.g. --role "
            "micro_batch=batch-size with --batch-size 32 in the command)",
        ),
        (
            [
                "--knob",
                "bs=4",
                "--role",
                "micro_batch=bs",
                "--role",
                "accum_steps=bs",
                "--print-spec",
                "--",
                "t",
            ],
            "the flags: command.roles: micro_batch and accum_steps both name 'bs' — each role changes its own knob",
        ),
        (
            ["--role", "micro_batch=trainer.batch", "--print-spec", "--", "true"],
            "--role micro_batch=trainer.batch: 'trainer.batch' looks like a config key, but no --config-file",
        ),
        (
            [
                "--role",
                "accum_steps=training.grad_accum",
                "--print-spec",
                "--",
                "python",
                "t.py",
                "training.batch_size=8",
            ],
            "--role accum_steps=training.grad_accum: 'training.grad_accum' is not in the command — add "
            "training.grad_accum=VALUE (the value it has now) beside the command's other overrides",
        ),
        (
            ["--bind", "bs=env:BS", "--role", "micro_batch=bs", "--print-spec", "--", "true"],
            "--bind bs=env:BS: give the knob its value too (--knob bs=VALUE)",
        ),
        (
            ["--memory-limit", "lots", "--print-spec", "--", "true"],
            "--memory-limit: 'lots' is not a size — write one such as 6GiB",
        ),
    ],
)
def test_a_spec_file_with_more_words_or_command_options_is_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    # A shell glob that matched two specs, or command options given to a spec: never a run
    # whose program is the YAML file.
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("name: a\nkind: command\ncommand: {argv: ['true']}\n")
    done = _run(*args, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"gpuwarden: {says}") and done.stderr.count("\n") == 1, done.stderr


def test_print_spec_with_json_prints_the_spec_as_json(tmp_path: Path) -> None:
    done = _run("--json", "--print-spec", "--name", "hello", "--", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["name"] == "hello" and document["command"]["argv"] == ["true"]


def test_knob_values_that_are_no_finite_number_stay_the_text_given(tmp_path: Path) -> None:
    done = _run(
        "--json",
        "--print-spec",
        "--knob",
        "bs=nan",
        "--knob",
        "lr=1e400",
        "--knob",
        "n=8",
        "--",
        "true",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["knobs"] == {"bs": "nan", "lr": "1e400", "n": 8}


def test_a_role_knob_the_command_never_uses_is_one_line(tmp_path: Path) -> None:
    # `--batch-size 32` typed as text: halving the knob would change nothing the script sees.
    flags = ["--knob", "bs=32", "--role", "micro_batch=bs", "--print-spec", "--"]
    forgot = _run(*flags, "python", "train.py", "--batch-size", "32", cwd=tmp_path)
    assert forgot.returncode == 2 and forgot.stdout == ""
    assert (
        forgot.stderr.startswith(
            "gpuwarden: command.roles.micro_batch: knob 'bs' reaches your program nowhere — write {bs}"
        )
        and forgot.stderr.count("\n") == 1
    ), forgot.stderr
    used = _run(*flags, "python", "train.py", "--batch-size={bs}", cwd=tmp_path)
    assert used.returncode == 0, used.stderr


def test_a_config_binding_without_the_file_names_the_flag_that_gives_it(tmp_path: Path) -> None:
    forgot = _run(
        "--bind", "bs=config:training.batch_size", "--print-spec", "--", "python", "t.py", cwd=tmp_path
    )
    assert forgot.returncode == 2 and forgot.stdout == "" and forgot.stderr.count("\n") == 1
    assert "bind.bs names a config key, but command.config_file is not set" in forgot.stderr
    assert "--config-file FILE" in forgot.stderr


def test_a_trainer_args_file_not_named_as_config_file_is_one_line(tmp_path: Path) -> None:
    # HfArgumentParser's idiom: `python ft.py args.json`, every TrainingArguments value in the file.
    (tmp_path / "args.json").write_text('{"output_dir": "out", "per_device_train_batch_size": 16}\n')
    flags = ["--framework", "transformers", "--print-spec"]
    unnamed = _run(*flags, "--", "python", "ft.py", "args.json", cwd=tmp_path)
    assert unnamed.returncode == 2 and unnamed.stdout == ""
    assert (
        unnamed.stderr.startswith(
            "gpuwarden: command.argv passes args.json, where transformers settings such as the batch size live"
        )
        and unnamed.stderr.count("\n") == 1
    ), unnamed.stderr
    named = _run(*flags, "--config-file", "args.json", "--", "python", "ft.py", "args.json", cwd=tmp_path)
    assert named.returncode == 0 and "micro_batch: per_device_train_batch_size" in named.stdout, named.stderr
    # a flag's value is not the program's arguments file
    other = _run(*flags, "--", "python", "ft.py", "--deepspeed", "args.json", cwd=tmp_path)
    assert other.returncode == 0, other.stderr


def test_checkpoints_flag_says_where_a_flags_only_script_saves(tmp_path: Path) -> None:
    # Without a spec file, a restart can only pass {resume_from} if the flags say where to look.
    given = _run(
        "--json", "--print-spec", "--checkpoints", "ckpt/step-*", "--",
        "python", "train.py", "--resume", "{resume_from?}", cwd=tmp_path,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["command"]["checkpoints"] == {"glob": "ckpt/step-*"}
    empty = _run("--print-spec", "--checkpoints", " ", "--", "python", "train.py", cwd=tmp_path)
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1
    assert "an empty pattern matches nothing — e.g. outputs/checkpoint-*" in empty.stderr
    # A pattern walked from the root or the home folder at every restart: refused, said once.
    for pattern, says in (("/**/*.pt", "the whole file system"), ("~/**/*.ckpt", "your whole home folder")):
        walked = _run("--print-spec", "--checkpoints", pattern, "--", "python", "train.py", cwd=tmp_path)
        assert walked.returncode == 2 and walked.stderr.count("\n") == 1, walked.stderr
        assert f"'{pattern}' searches {says} at every restart — start it in the folder" in walked.stderr
    deep = _run("--print-spec", "--checkpoints", "runs/**/*.pt", "--", "python", "train.py", cwd=tmp_path)
    assert deep.returncode == 0, deep.stderr  # recursive under the program's own folder: fine


def test_a_role_may_name_a_flag_of_the_command_under_a_framework_preset(tmp_path: Path) -> None:
    # The preset makes knobs of the command's flags after the flags are read: a role naming
    # one (a flag the preset knows, or one it does not) is that knob, not "no knob".
    flags = ["--json", "--print-spec", "--framework", "transformers"]
    argv = [
        "python",
        "ft.py",
        "--per_device_train_batch_size",
        "8",
        "--max-seq-length",
        "512",
        "--output_dir",
        "o",
    ]
    roles = ["--role", "micro_batch=per_device_train_batch_size", "--role", "max_length=max_seq_length"]
    named = _run(*flags, *roles, "--", *argv, cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    spec = json.loads(named.stdout)
    assert spec["command"]["roles"]["micro_batch"] == "per_device_train_batch_size"
    assert spec["command"]["roles"]["max_length"] == "max_seq_length"
    assert spec["knobs"]["max_seq_length"] == 512 and "{max_seq_length}" in spec["command"]["argv"]
    absent = _run(*flags, "--role", "max_length=max_len", "--", *argv, cwd=tmp_path)
    assert absent.returncode == 2 and absent.stderr.count("\n") == 1
    assert "command.roles.max_length: no knob 'max_len' — the command has no --max_len flag" in absent.stderr


def test_a_role_may_name_a_flag_of_a_plain_command(tmp_path: Path) -> None:
    # No preset: the flags the roles name, written as the command writes them, become knobs.
    flags = [
        "--json",
        "--print-spec",
        "--role",
        "micro_batch=batch-size",
        "--role",
        "accum_steps=--grad-accum",
    ]
    named = _run(*flags, "--", "python", "train.py", "--batch-size", "64", "--grad-accum=2", cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    spec = json.loads(named.stdout)
    assert spec["command"]["argv"] == [
        "python",
        "train.py",
        "--batch-size",
        "{batch_size}",
        "--grad-accum={grad_accum}",
    ]
    assert spec["command"]["roles"] == {"micro_batch": "batch_size", "accum_steps": "grad_accum"}
    assert spec["knobs"] == {"batch_size": 64, "grad_accum": 2}
    # Passed twice, the program takes the last one: both become the knob, holding the last value.
    twice = _run("--json", "--print-spec", "--role", "micro_batch=batch-size", "--", "python", "t.py",
                 "--batch-size", "4", "--batch_size=8", cwd=tmp_path)  # fmt: skip
    assert twice.returncode == 0, twice.stderr
    spec = json.loads(twice.stdout)
    assert spec["command"]["argv"][2:] == ["--batch-size", "{batch_size}", "--batch_size={batch_size}"]
    assert spec["knobs"] == {"batch_size": 8}
    # A role naming a flag the command does not pass is one line with the fix.
    missing = _run(
        "--print-spec",
        "--role",
        "micro_batch=bsz",
        "--",
        "python",
        "train.py",
        "--batch-size",
        "64",
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert (
        "no knob 'bsz' and no --bsz VALUE in the command — add --bsz N (the value the program uses now)"
        in missing.stderr
    )


def test_a_preset_setting_passed_twice_is_the_knob_at_both_places_holding_the_last(tmp_path: Path) -> None:
    # argparse takes the last: a retune that changed only the first would change nothing.
    argv = ["python", "ft.py", "--per_device_train_batch_size", "8", "--per_device_train_batch_size=16"]
    done = _run("--json", "--print-spec", "--framework", "transformers", "--", *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert spec["command"]["argv"][2:] == [
        "--per_device_train_batch_size",
        "{per_device_train_batch_size}",
        "--per_device_train_batch_size={per_device_train_batch_size}",
        "--resume_from_checkpoint",
        "{resume_from?}",
    ]
    assert spec["knobs"]["per_device_train_batch_size"] == 16


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("1300MiB", "1300MiB"),
        ("6GiB", "6GiB"),
        ("1500MB", "1500MB"),
        ("1.5GiB", "1536MiB"),
        ("123456789", "123456789"),
    ],
)
def test_print_spec_writes_a_memory_limit_as_a_size_that_reads_back_the_same(
    tmp_path: Path, given: str, written: str
) -> None:
    printed = _run("--print-spec", "--memory-limit", given, "--", "python", "-c", "pass", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert f"  memory_limit: {written}\n" in printed.stdout
    as_json = _run(
        "--print-spec", "--json", "--memory-limit", given, "--", "python", "-c", "pass", cwd=tmp_path
    )
    limit = json.loads(as_json.stdout)["resources"]["memory_limit"]
    assert isinstance(limit, int)  # for programs: the count
    again = spec_from_mapping(yaml.safe_load(printed.stdout), label="printed")
    assert again.resources.memory_limit == limit


def test_a_role_naming_a_variable_of_the_shell_takes_its_value_or_says_in_one_short_line(
    tmp_path: Path,
) -> None:
    bound = _run(
        "--json", "--print-spec", "--role", "micro_batch=MICRO", "--", "python", "t.py", cwd=tmp_path
    )
    assert bound.returncode == 2 and bound.stderr.count("\n") == 1  # set nowhere yet: one line, the fix
    assert "no variable MICRO set — give the variable its value (--env MICRO=N" in bound.stderr
    given = _run(
        "--json", "--print-spec", "--env", "MICRO=8", "--role", "micro_batch=MICRO", "--", "python", "t.py",
        cwd=tmp_path,
    )  # fmt: skip
    spec = json.loads(given.stdout)
    assert spec["knobs"] == {"micro": 8} and spec["command"]["bind"] == {"micro": {"env": "MICRO"}}
    assert "MICRO" not in spec.get("env", {})  # each attempt gets its knob's value, not the first one
    # A variable that holds no batch size (PATH here) is refused in one bounded line.
    path = _run("--print-spec", "--role", "micro_batch=PATH", "--", "python", "t.py", cwd=tmp_path)
    assert path.returncode == 2 and path.stderr.count("\n") == 1 and len(path.stderr) < 200, path.stderr
    assert "knobs.path (command.roles.micro_batch) is '" in path.stderr
    assert path.stderr.rstrip().endswith("a micro_batch must be a whole number ≥ 1")


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--memory-limit", "gpuwarden: --memory-limit: '' is not a size"),
        ("--policy", "gpuwarden: --policy: '' is not a policy name"),
        ("--name", "gpuwarden: --name: must be 1–64 letters"),
    ],
)
def test_an_empty_value_is_refused_not_taken_as_the_flag_left_out(
    tmp_path: Path, flag: str, says: str
) -> None:
    """`--memory-limit "$LIMIT"` with LIMIT unset would otherwise run with no limit at all."""
    done = _run(flag, "", "--print-spec", "--", "true", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_every_role_a_spec_takes_is_a_role_the_cli_takes() -> None:
    from gpuwarden.cli.command_spec import _ROLES
    from gpuwarden.core.config.spec_command import Roles

    assert set(_ROLES) == set(Roles.model_fields)
