"""Submit-time completion and per-attempt preparation of a user's program."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.command.batch_hint import unnamed_batch_warning
from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import ENV_EVENTS_FILE, ENV_RESUME_FROM, prepare_attempt
from gpuwarden.core.command.record import RECORD_NAME, attempt_dir, read_record, summary_lines
from gpuwarden.core.command.resume import nowhere_warning
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import ConfigError, UserError

CONFIG = "training:\n  batch_size: 16   # micro\n  gradient_accumulation_steps: 1\ndata:\n  loading:\n    max_length: 1024\n"


def _spec(tmp_path: Path, **command: Any) -> RunSpec:
    config = tmp_path / "default.yaml"
    if not config.exists():
        config.write_text(CONFIG)
    data: dict[str, Any] = {
        "name": "own",
        "kind": "command",
        "command": {
            "argv": ["python", "train.py", "--config", "{config_file}", "--resume", "{resume_from?}"],
            "config_file": str(config),
            "cwd": str(tmp_path),
            "bind": {
                "micro": {"config": "training.batch_size"},
                "accum": {"config": "training.gradient_accumulation_steps"},
                "max_len": {"config": "data.loading.max_length"},
                "alloc": {"env": "PYTORCH_ALLOC_CONF"},
            },
            "roles": {"micro_batch": "micro", "accum_steps": "accum", "max_length": "max_len"},
            "checkpoints": {"glob": "outputs/checkpoint-*", "complete_when": "done"},
        },
        "knobs": {"alloc": "expandable_segments:False"},
    }
    for key, value in command.items():
        if key in ("bind", "knobs"):  # `knobs` is the spec's own, beside `command`
            (data["command"]["bind"] if key == "bind" else data["knobs"]).update(value)
        else:
            data["command"][key] = value
    return complete_command(spec_from_mapping(data))


def test_config_values_become_knobs_at_submit(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.knobs == {"alloc": "expandable_segments:False", "micro": 16, "accum": 1, "max_len": 1024}
    assert complete_command(spec) == spec  # running it twice changes nothing


def test_first_attempt_copy_equals_the_file_and_later_ones_carry_the_retune(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    run_dir = tmp_path / "run"
    first = prepare_attempt(spec, "r1", run_dir, 1)
    copy = run_dir / "attempts" / "1" / "default.yaml"
    assert first.argv == ["python", "train.py", "--config", str(copy)]
    assert copy.read_text() == CONFIG
    assert first.env["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"
    assert first.env[ENV_EVENTS_FILE] == str(run_dir / "attempts" / "1" / "events.jsonl")
    assert first.note == "" and first.cwd == tmp_path

    # The program wrote two checkpoints; the newer one is not complete yet.
    for step, complete in ((2, True), (3, False)):
        folder = tmp_path / "outputs" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if complete:
            (folder / "done").write_text("")
    retuned = spec.model_copy(update={"knobs": {**spec.knobs, "micro": 4, "accum": 4}})
    second = prepare_attempt(retuned, "r1", run_dir, 2)
    resume = str(tmp_path / "outputs" / "checkpoint-2")
    assert second.argv[-2:] == ["--resume", resume]
    assert second.env[ENV_RESUME_FROM] == resume
    assert "attempt 2 resumes from" in second.note and "(step 2)" in second.note
    record = read_record(run_dir, 2)
    assert record is not None
    assert record.config is not None
    assert record.config.changes == {
        "training.batch_size": (16, 4),
        "training.gradient_accumulation_steps": (1, 4),
    }
    lines = summary_lines(record)
    assert lines[0].startswith("config ") and "training.batch_size 16 → 4" in lines[0]
    assert "-  batch_size: 16   # micro" in lines and "+  batch_size: 4    # micro" in lines
    assert (tmp_path / "default.yaml").read_text() == CONFIG


def test_a_restart_without_a_complete_checkpoint_starts_from_scratch_and_says_so(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert "--resume" not in second.argv
    assert second.note == "attempt 2 starts from scratch: no complete checkpoint from an earlier attempt"


def test_a_restart_of_a_spec_that_names_no_checkpoints_claims_no_scratch_start(tmp_path: Path) -> None:
    # The program may resume by itself (a batch job that goes on after its last output line).
    spec = _spec(tmp_path, checkpoints=None)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    assert prepare_attempt(spec, "r1", run_dir, 2).note == (
        "attempt 2 is given no checkpoint (the spec names none: --checkpoints GLOB, and the program "
        "reported none): it starts from the beginning unless it picks up its own progress"
    )


def test_checkpoints_left_by_an_earlier_run_are_not_this_runs(tmp_path: Path) -> None:
    old = tmp_path / "outputs" / "checkpoint-9"
    old.mkdir(parents=True)
    (old / "done").write_text("")
    past = time.time() - 3600
    os.utime(old, (past, past))
    spec = _spec(tmp_path)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    assert "starts from scratch" in prepare_attempt(spec, "r1", run_dir, 2).note


def test_reported_checkpoints_count_too(tmp_path: Path) -> None:
    spec = _spec(tmp_path, checkpoints=None)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    ckpt = tmp_path / "mine" / "step-5.pt"
    ckpt.parent.mkdir()
    ckpt.write_text("x")
    events = run_dir / "attempts" / "1" / "events.jsonl"
    line = {"v": 1, "type": "checkpoint", "ts": 1.0, "path": "mine/step-5.pt", "step": 5, "samples_seen": 80}
    events.write_text(json.dumps(line) + "\n" + '{"partial": ')
    assert prepare_attempt(spec, "r1", run_dir, 2).argv[-1] == str(ckpt)
    # A long run's events: a checkpoint among a hundred thousand progress lines, in the SDK's
    # spacing, is found by reading a line at a time.
    progress = json.dumps({"v": 1, "type": "progress", "ts": 2.0, "step": 6, "samples_seen": 96}) + "\n"
    later = tmp_path / "mine" / "step-9.pt"
    later.write_text("y")
    spaced = json.dumps({**line, "path": "mine/step-9.pt", "step": 9}, separators=(", ", ": "))
    with events.open("w") as out:
        out.writelines([progress] * 50_000 + [spaced + "\n"] + [progress] * 50_000)
    assert prepare_attempt(spec, "r1", run_dir, 2).argv[-1] == str(later)


def _complete_checkpoint(tmp_path: Path, step: int) -> Path:
    folder = tmp_path / "outputs" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "done").write_text("")
    return folder


def test_a_checkpoint_the_command_passes_nowhere_is_found_but_not_handed_over(tmp_path: Path) -> None:
    argv = ["python", "train.py", "--config", "{config_file}"]
    spec = _spec(tmp_path, argv=argv)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    folder = _complete_checkpoint(tmp_path, 2)
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert second.record.resume_from is None and str(folder) not in second.argv
    assert second.note == (
        f"attempt 2 found {folder} (step 2) but the command passes it nowhere — it starts from the "
        "beginning; put {resume_from} in its argv, e.g. --resume {resume_from?}"
    )
    assert second.env[ENV_RESUME_FROM] == str(folder)  # for a script that asks the SDK
    assert nowhere_warning(spec) is not None


@pytest.mark.parametrize(
    "command",
    [
        {"env": {"CKPT": "{resume_from}"}},
        {"bind": {"ckpt": {"env": "CKPT"}}, "knobs": {"ckpt": "{resume_from}"}},
        {"bind": {"ckpt": {"config": "training.resume"}}, "knobs": {"ckpt": "{resume_from?}"}},
        {
            "checkpoints": {
                "glob": "outputs/checkpoint-*",
                "complete_when": "done",
                "config_key": "training.resume",
            }
        },
    ],
)
def test_a_checkpoint_passed_through_a_variable_or_the_config_copy_is_handed_over(
    tmp_path: Path, command: dict[str, Any]
) -> None:
    spec = _spec(tmp_path, argv=["python", "train.py", "--config", "{config_file}"], **command)
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    folder = _complete_checkpoint(tmp_path, 2)
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert second.record.resume_from == str(folder) and "resumes from" in second.note
    assert nowhere_warning(spec) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bind": {"micro": {"config": "training.nope"}}}, "has no key 'training.nope'"),
        ({"bind": {"micro": {"config": "training"}}}, "is a mapping, not a single value"),
        ({"argv": ["python", "train.py"]}, "neither argv nor command.env passes it — put {config_file}"),
        ({"roles": {"micro_batch": "alloc"}}, "a micro_batch must be a whole number"),
        ({"bind": {"accum": {"flag": "grad-accum", "default": 1}}}, "is not a flag — write it like --grad"),
        ({"bind": {"accum": {"flag": "--grad-accum"}}}, "a `flag` binding needs `default`: the value"),
    ],
)
def test_mistakes_are_one_line_at_submit(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        _spec(tmp_path, **change)
    assert "\n" not in str(err.value)


def test_roles_must_name_knobs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"command.roles.micro_batch: no knob 'mcro'"):
        _spec(tmp_path, roles={"micro_batch": "mcro"})


def test_a_role_naming_a_flag_of_the_command_makes_it_a_knob(tmp_path: Path) -> None:
    def plain(argv: list[str], roles: dict[str, str]) -> RunSpec:
        document = {
            "name": "own",
            "kind": "command",
            "command": {"argv": argv, "cwd": str(tmp_path), "roles": roles},
        }
        return complete_command(spec_from_mapping(document))

    spec = plain(
        ["python", "train.py", "--batch-size", "16", "--accum=2"],
        {"micro_batch": "batch_size", "accum_steps": "--accum"},
    )
    assert spec.command is not None
    assert spec.command.argv == ["python", "train.py", "--batch-size", "{batch_size}", "--accum={accum}"]
    assert spec.knobs["batch_size"] == 16 and spec.knobs["accum"] == 2
    assert spec.command.roles.knob_names() == {"micro_batch": "batch_size", "accum_steps": "accum"}
    with pytest.raises(
        ConfigError, match=r"no knob 'bsz' — .* or pass it as a flag of the command \(--bsz VALUE\)"
    ):
        plain(["python", "train.py", "--batch-size", "16"], {"micro_batch": "bsz"})


def test_the_config_path_in_argv_becomes_the_copy(tmp_path: Path) -> None:
    spec = _spec(tmp_path, argv=["python", "train.py", "--config=default.yaml"])
    assert spec.command is not None
    assert spec.command.argv == ["python", "train.py", "--config={config_file}"]


def test_a_record_that_is_not_a_regular_file_reads_as_none_at_once(tmp_path: Path) -> None:
    """The run folder is the user's: the API reads each attempt's record on a request thread, which
    a FIFO in its place used to hold for good."""
    folder = attempt_dir(tmp_path, 1)
    folder.mkdir(parents=True)
    os.mkfifo(folder / RECORD_NAME)
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(read_record(tmp_path, 1)), daemon=True)
    reader.start()
    reader.join(20)
    assert found == [None]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--batch-size", "64"], "--batch-size"),
        (["--bs=4"], "--bs"),
        (["--per-gpu-batch", "8"], "--per-gpu-batch"),
        (["--micro_batch", "2"], "--micro_batch"),
        (["--batches", "3"], None),  # a count of batches, not their size
        (["--max-batch-tokens", "4096"], None),
        (["--batch-size", "auto"], None),  # no number to retune
    ],
)
def test_the_flags_that_read_as_a_batch_size(tmp_path: Path, argv: list[str], flag: str | None) -> None:
    document = {
        "name": "own",
        "kind": "command",
        "command": {"argv": ["python", "t.py", *argv], "cwd": str(tmp_path)},
    }
    said = unnamed_batch_warning(spec_from_mapping(document))
    assert (said is not None and f"if {flag} sets the micro-batch" in said) if flag else said is None, said
