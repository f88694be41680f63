"""A training loop of the user's own on Accelerate (the shape of transformers' *_no_trainer.py
examples): its preset resumes from the `step_N` folders `accelerator.save_state` writes, and a
run submitted with the Trainer's preset is told, at the restart that finds no `checkpoint-*`,
that its `step_N` folders were there."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping

ARGV = [
    "accelerate",
    "launch",
    "train.py",
    "--per_device_train_batch_size",
    "16",
    "--output_dir",
    "out",
    "--checkpointing_steps",
    "1",
]


def _spec(tmp_path: Path, framework: str, **extra: Any) -> RunSpec:
    command = {"argv": ARGV, "framework": framework, "cwd": str(tmp_path), **extra}
    return complete_command(spec_from_mapping({"name": "a", "kind": "command", "command": command}))


def _save_state(folder: Path, *, complete: bool = True, age_s: float = 0.0) -> Path:
    """A folder as accelerator.save_state leaves it (the random states last); `complete=False`:
    cut short before them."""
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin"):
        (folder / name).write_bytes(b"x")
    if complete:
        (folder / "random_states_0.pkl").write_bytes(b"x")
    if age_s:
        past = time.time() - age_s
        for path in [*folder.iterdir(), folder]:
            os.utime(path, (past, past))
    return folder


def test_the_preset_takes_the_trainer_flag_names_and_looks_for_save_state_folders(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "accelerate")
    assert spec.command is not None
    assert spec.command.argv == [
        "accelerate",
        "launch",
        "train.py",
        "--per_device_train_batch_size",
        "{per_device_train_batch_size}",
        "--output_dir",
        "{output_dir}",
        "--checkpointing_steps",
        "1",
        "--resume_from_checkpoint",
        "{resume_from?}",
    ]
    # Passed once a retune sets it: a script without the flag runs at 1 as it always did.
    binding = spec.command.bind["gradient_accumulation_steps"]
    assert (binding.flag, binding.default) == ("--gradient_accumulation_steps", 1)
    assert spec.knobs == {
        "per_device_train_batch_size": 16,
        "output_dir": "out",
        "gradient_accumulation_steps": 1,
    }
    roles = spec.command.roles
    assert (roles.micro_batch, roles.accum_steps, roles.output_dir) == (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "output_dir",
    )
    assert spec.command.checkpoints is not None
    assert spec.command.checkpoints.glob == "{output_dir}/*_[0-9]*"
    assert spec.command.checkpoints.complete_when == "random_states_0.pkl"
    assert complete_command(spec) == spec


def test_max_train_steps_is_the_step_bound_probes_set(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "accelerate", argv=[*ARGV, "--max_train_steps", "40"])
    assert spec.command is not None
    assert spec.command.roles.max_steps == "max_train_steps"
    assert spec.knobs["max_train_steps"] == 40


def test_a_restart_resumes_from_the_newest_complete_step_folder(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "accelerate")
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    _save_state(tmp_path / "out" / "step_2")
    newest = _save_state(tmp_path / "out" / "step_3")
    _save_state(tmp_path / "out" / "step_4", complete=False)  # the out-of-memory cut it short
    (tmp_path / "out" / "step_10.log").write_text("not a checkpoint")
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert second.argv[-2:] == ["--resume_from_checkpoint", str(newest)]
    assert second.note == f"attempt 2 resumes from {newest} (step 3)"


def test_the_trainer_preset_says_where_the_accelerate_checkpoints_were(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "transformers")
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    _save_state(tmp_path / "out" / "step_2")
    newest = _save_state(tmp_path / "out" / "step_3")
    os.utime(newest / "random_states_0.pkl", (time.time() + 5, time.time() + 5))
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert "--resume_from_checkpoint" not in second.argv
    assert second.note == (
        "attempt 2 starts from scratch: no complete checkpoint where the spec looks (out/checkpoint-*), "
        f"but {newest} is an Accelerate checkpoint (accelerator.save_state) this run wrote — submit "
        "with --framework accelerate (framework: accelerate) so that a restart resumes from it"
    )


def test_a_spec_without_checkpoints_is_told_of_one_in_its_working_folder(tmp_path: Path) -> None:
    spec = complete_command(
        spec_from_mapping(
            {
                "name": "a",
                "kind": "command",
                "command": {"argv": ["python", "train.py"], "cwd": str(tmp_path)},
            }
        )
    )
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    found = _save_state(tmp_path / "epoch_0")
    note = prepare_attempt(spec, "r1", run_dir, 2).note
    assert note.startswith(f"attempt 2 starts from scratch: the spec names no checkpoints, but {found} is an")


def test_folders_of_an_earlier_run_or_of_the_spec_own_layout_are_not_named(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "transformers")
    run_dir = tmp_path / "run"
    _save_state(tmp_path / "out" / "step_7", age_s=3600)  # left by yesterday's run
    trainer = tmp_path / "out" / "checkpoint-2"  # the Trainer's own, cut short: not complete
    trainer.mkdir(parents=True)
    prepare_attempt(spec, "r1", run_dir, 1)
    (tmp_path / "out" / "checkpoint-3").mkdir()
    (tmp_path / "out" / "checkpoint-3" / "trainer_state.json").write_text("{}")
    os.utime(tmp_path / "out" / "checkpoint-3", (time.time() - 3600,) * 2)
    os.utime(tmp_path / "out" / "checkpoint-3" / "trainer_state.json", (time.time() - 3600,) * 2)
    note = prepare_attempt(spec, "r1", run_dir, 2).note
    assert note == "attempt 2 starts from scratch: no complete checkpoint from an earlier attempt"


def _retuned(spec: RunSpec, micro: int, accum: int) -> RunSpec:
    knobs = {**spec.knobs, "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum}
    return spec.model_copy(update={"knobs": knobs})


def test_a_resume_with_another_accumulation_from_a_step_folder_is_said_to_be_inexact(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "accelerate")
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    _save_state(tmp_path / "out" / "step_3")
    second = prepare_attempt(_retuned(spec, 8, 2), "r1", run_dir, 2)
    assert second.argv[-4:] == [
        "--gradient_accumulation_steps",
        "2",
        "--resume_from_checkpoint",
        str(tmp_path / "out" / "step_3"),
    ]
    assert second.warning == (
        "resumed from step_3 with accumulation 2, written with 1: Accelerate restores its micro-batch "
        "counter from the checkpoint, so the accumulation windows after the resume are shifted and the "
        "run differs from an uninterrupted one — unless the script sets accelerator.step = 0 after "
        "accelerator.load_state"
    )
    # Attempt 3 resumes from the folder attempt 2 wrote, with the accumulation attempt 2 had.
    newest = _save_state(tmp_path / "out" / "step_4")
    os.utime(newest, (time.time() + 5,) * 2)
    third = prepare_attempt(_retuned(spec, 8, 2), "r1", run_dir, 3)
    assert third.record.resume_from == str(newest)
    assert third.warning == ""


def test_an_epoch_folder_or_the_same_accumulation_resumes_exactly(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "accelerate")
    prepare_attempt(spec, "r1", tmp_path / "run", 1)
    _save_state(tmp_path / "out" / "step_3")
    assert prepare_attempt(spec, "r1", tmp_path / "run", 2).warning == ""  # restarted as it was
    # `--checkpointing_steps epoch`: the counter restarts at each epoch's end.
    epochs = tmp_path / "epochs"
    epochs.mkdir()
    spec = _spec(epochs, "accelerate")
    prepare_attempt(spec, "r2", epochs / "run", 1)
    epoch = _save_state(epochs / "out" / "epoch_0")
    second = prepare_attempt(_retuned(spec, 8, 2), "r2", epochs / "run", 2)
    assert second.record.resume_from == str(epoch)
    assert second.warning == ""
