"""Framework presets: Trainer and Lightning settings become knobs with roles, nothing else moves."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.command.batch_hint import unnamed_batch_warning
from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.command.record import summary_lines
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.recovery import apply_decision, current_knobs
from gpuwarden.core.oom.retune import RetuneDecision
from gpuwarden.core.oom.roles import effective_batch_of


def _command(argv: list[str], framework: str, knobs: dict[str, Any] | None = None, **extra: Any) -> RunSpec:
    command = {"argv": argv, "framework": framework, **extra}
    return complete_command(
        spec_from_mapping({"name": "p", "kind": "command", "command": command, "knobs": knobs or {}})
    )


def test_transformers_flags_become_knobs_and_the_restart_flags_are_added() -> None:
    spec = _command(
        [
            "python",
            "ft.py",
            "--output_dir",
            "out",
            "--per_device_train_batch_size=8",
            "--gradient_checkpointing",
        ],
        "transformers",
    )
    assert spec.command is not None
    assert spec.command.argv == [
        "python",
        "ft.py",
        "--output_dir",
        "{output_dir}",
        "--per_device_train_batch_size={per_device_train_batch_size}",
        "--gradient_checkpointing",
        "{gradient_checkpointing}",
        "--resume_from_checkpoint",
        "{resume_from?}",
    ]
    # The accumulation the program did not pass goes in only once a retune sets it.
    binding = spec.command.bind["gradient_accumulation_steps"]
    assert (binding.flag, binding.default) == ("--gradient_accumulation_steps", 1)
    # So does the evaluation's batch, at the Trainer's default: lowered after an OOM in evaluation.
    binding = spec.command.bind["per_device_eval_batch_size"]
    assert (binding.flag, binding.default) == ("--per_device_eval_batch_size", 8)
    assert spec.command.roles.eval_batch == "per_device_eval_batch_size"
    assert spec.knobs == {
        "output_dir": "out",
        "per_device_train_batch_size": 8,
        "gradient_checkpointing": True,
        "gradient_accumulation_steps": 1,
        "per_device_eval_batch_size": 8,
    }
    assert spec.command.roles.micro_batch == "per_device_train_batch_size"
    assert spec.command.checkpoints is not None
    assert spec.command.checkpoints.glob == "{output_dir}/checkpoint-*"
    assert spec.command.checkpoints.complete_when == "trainer_state.json"
    assert complete_command(spec) == spec


def test_a_retune_of_a_trainer_run_keeps_its_effective_batch() -> None:
    spec = _command(
        ["python", "ft.py", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2"],
        "transformers",
    )
    assert current_knobs(spec) == {"batch_size": 16, "grad_accum_steps": 2, "eval_batch_size": 8}
    decision = RetuneDecision("reduce_micro_batch", {"batch_size": (16, 4), "grad_accum_steps": (2, 8)})
    doc, before, after = apply_decision(spec, decision)
    assert after == {"knobs.per_device_train_batch_size": 4, "knobs.gradient_accumulation_steps": 8}
    assert before == {"knobs.per_device_train_batch_size": 16, "knobs.gradient_accumulation_steps": 2}
    assert effective_batch_of(doc) == effective_batch_of(spec.model_dump(mode="json")) == 32


def test_transformers_args_file_gets_its_keys_changed_in_the_copy(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{\n  "output_dir": "out",\n  "per_device_train_batch_size": 8\n}\n')
    spec = _command(["python", "ft.py", str(args)], "transformers", config_file=str(args), cwd=str(tmp_path))
    assert spec.command is not None
    assert spec.command.argv == ["python", "ft.py", "{config_file}"]
    assert spec.command.bind["per_device_train_batch_size"].config == "per_device_train_batch_size"
    assert (
        spec.command.checkpoints is not None
        and spec.command.checkpoints.config_key == "resume_from_checkpoint"
    )
    retuned = spec.model_copy(
        update={"knobs": {**spec.knobs, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}}
    )
    (tmp_path / "out" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-3" / "trainer_state.json").write_text("{}")
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r", run_dir, 1)
    second = prepare_attempt(retuned, "r", run_dir, 2)
    assert second.record.config is not None
    assert second.record.config.changes == {
        "per_device_train_batch_size": (8, 4),
        "gradient_accumulation_steps": (1, 2),
        "resume_from_checkpoint": (None, str(tmp_path / "out" / "checkpoint-3")),
    }
    # A key the file did not hold is set, not changed from a None the user never wrote.
    assert f"resume_from_checkpoint set to {tmp_path / 'out' / 'checkpoint-3'}" in second.note
    assert "None" not in summary_lines(second.record)[0]


def test_lightning_flags_and_ckpt_path() -> None:
    spec = _command(
        ["python", "fit.py", "--batch-size", "16", "--default_root_dir", "runs", "--max_steps", "8"],
        "lightning",
    )
    assert spec.command is not None
    assert spec.command.argv[-2:] == ["--ckpt_path", "{resume_from?}"]
    assert spec.command.bind["accumulate_grad_batches"].flag == "--accumulate_grad_batches"
    assert spec.knobs == {
        "batch_size": 16,
        "default_root_dir": "runs",
        "max_steps": 8,
        "accumulate_grad_batches": 1,
    }
    assert spec.command.roles.max_steps == "max_steps"
    assert (
        spec.command.checkpoints is not None
        and spec.command.checkpoints.glob == "{default_root_dir}/**/*.ckpt"
    )


def test_nothing_the_user_set_is_overridden() -> None:
    spec = _command(
        ["python", "ft.py", "--per_device_train_batch_size", "{bs}", "--resume", "{resume_from?}"],
        "transformers",
        roles={"micro_batch": "bs"},
        knobs={"bs": 8},
    )
    assert spec.command is not None
    assert spec.command.argv == [
        "python",
        "ft.py",
        "--per_device_train_batch_size",
        "{bs}",
        "--resume",
        "{resume_from?}",
    ]


def test_trainer_precision_flags_become_one_precision_knob() -> None:
    spec = _command(["python", "ft.py", "--bf16", "--per_device_train_batch_size", "8"], "transformers")
    assert spec.command is not None
    assert spec.command.argv[2:6] == ["--bf16", "{precision=bf16}", "--fp16", "{precision=fp16}"]
    assert spec.knobs["precision"] == "bf16"
    assert spec.command.roles.precision == "precision"
    assert complete_command(spec) == spec  # a completed spec stays as it is
    assert current_knobs(spec)["precision"] == "bf16"


def test_trainer_precision_renders_both_switches_and_a_retune_moves_them(tmp_path: Path) -> None:
    spec = _command(["python", "ft.py", "--fp16=true", "--bf16", "false"], "transformers")
    assert spec.knobs["precision"] == "fp16"
    argv = prepare_attempt(spec, "r", tmp_path / "run", 1).argv
    assert argv[2:6] == ["--bf16", "false", "--fp16", "true"]
    decision = RetuneDecision("lower_precision", {"precision": ("fp16", "bf16")})
    doc, _, after = apply_decision(spec, decision)
    assert after == {"knobs.precision": "bf16"}
    retuned = spec_from_mapping(doc)
    argv = prepare_attempt(retuned, "r", tmp_path / "run", 2).argv
    assert argv[2:6] == ["--bf16", "true", "--fp16", "false"]


def test_trainer_without_precision_flags_gets_no_precision_knob() -> None:
    spec = _command(["python", "ft.py", "--per_device_train_batch_size", "8"], "transformers")
    assert spec.command is not None
    assert "precision" not in spec.knobs and spec.command.roles.precision is None
    assert not any("bf16" in a for a in spec.command.argv)


def test_both_precision_switches_on_is_one_line() -> None:
    with pytest.raises(UserError, match="bf16 and fp16 are both on"):
        _command(["python", "ft.py", "--bf16", "--fp16", "true"], "transformers")


def test_trainer_args_file_precision_keys_are_switched_in_the_copy(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{\n  "per_device_train_batch_size": 8,\n  "bf16": true\n}\n')
    spec = _command(["python", "ft.py", str(args)], "transformers", config_file=str(args), cwd=str(tmp_path))
    assert spec.command is not None
    assert spec.knobs["precision"] == "bf16"
    assert spec.command.bind["precision"].flags == {"bf16": "bf16", "fp16": "fp16"}
    assert complete_command(spec) == spec
    retuned = spec_from_mapping(
        apply_decision(spec, RetuneDecision("lower_precision", {"precision": ("bf16", "fp16")}))[0]
    )
    record = prepare_attempt(retuned, "r", tmp_path / "run", 1).record
    assert record.config is not None
    assert record.config.changes == {"bf16": (True, False), "fp16": (None, True)}
    assert args.read_text().count("true") == 1  # the user's file is only read


def test_a_knob_value_in_the_spec_wins_over_the_flag_text(tmp_path: Path) -> None:
    # What a tuned spec looks like: the user's argv, the tuned values under `knobs:`.
    spec = _command(
        ["python", "ft.py", "--per_device_train_batch_size", "16"],
        "transformers",
        knobs={"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4},
    )
    assert spec.command is not None
    assert spec.command.argv[2:4] == ["--per_device_train_batch_size", "{per_device_train_batch_size}"]
    assert current_knobs(spec) == {"batch_size": 4, "grad_accum_steps": 4, "eval_batch_size": 8}
    tuned = prepare_attempt(spec, "r", tmp_path / "run", 1)
    assert tuned.argv[2:6] == ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4"]


PRINTED_LIGHTNING_CLI = """\
# what `python main.py fit --print_config` writes, in part
seed_everything: 0
trainer:
  max_steps: -1
  max_epochs: 6
  accumulate_grad_batches: 1
  default_root_dir: null
data:
  batch_size: 64
ckpt_path: null
"""


def test_a_config_lightning_cli_printed_is_taken_with_its_train_by_epochs_max_steps(tmp_path: Path) -> None:
    (tmp_path / "full.yaml").write_text(PRINTED_LIGHTNING_CLI)
    argv = ["python", "main.py", "fit", "--config", "full.yaml"]
    spec = _command(argv, "lightning", cwd=str(tmp_path), config_file=str(tmp_path / "full.yaml"))
    assert spec.command is not None
    assert spec.knobs["max_steps"] == -1 and spec.command.roles.max_steps == "max_steps"
    first = prepare_attempt(spec, "r1", tmp_path / "run", 1)
    assert first.record.config is not None and first.record.config.changes == {}


def test_a_lightning_cli_config_without_max_steps_can_still_be_probed(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("trainer:\n  max_epochs: 6\ndata:\n  batch_size: 64\n")
    argv = ["python", "main.py", "fit", "--config", "config.yaml"]
    spec = _command(argv, "lightning", cwd=str(tmp_path), config_file=str(tmp_path / "config.yaml"))
    assert spec.command is not None and spec.command.roles.max_steps == "max_steps"
    assert spec.knobs["max_steps"] == -1
    first = prepare_attempt(spec, "r1", tmp_path / "run", 1)
    assert first.record.config is not None and first.record.config.changes == {}  # the file as written
    probe = spec.model_copy(update={"knobs": {**spec.knobs, "max_steps": 5}})
    copy = prepare_attempt(probe, "p1", tmp_path / "probe", 1).record.config
    assert copy is not None and copy.changes == {"trainer.max_steps": (-1, 5)}


def test_max_steps_below_one_other_than_no_limit_is_one_line() -> None:
    with pytest.raises(UserError, match=r"a max_steps must be a whole number ≥ 1, or -1 for no limit"):
        _command(["python", "t.py", "--max_steps", "0"], "lightning")


def _composed(tmp_path: Path, order: list[str]) -> RunSpec:
    (tmp_path / "base.yaml").write_text("trainer:\n  accumulate_grad_batches: 1\ndata:\n  batch_size: 64\n")
    (tmp_path / "exp.yaml").write_text("trainer:\n  max_epochs: 4\n")
    argv = ["python", "main.py", "fit"] + [arg for name in order for arg in ("--config", name)]
    return _command(argv, "lightning", cwd=str(tmp_path), config_file=str(tmp_path / "exp.yaml"))


def test_a_composed_lightning_cli_config_retunes_through_the_copy_of_its_last_file(tmp_path: Path) -> None:
    spec = _composed(tmp_path, ["base.yaml", "exp.yaml"])
    assert spec.command is not None
    assert spec.knobs["batch_size"] == 64 and spec.command.roles.micro_batch == "batch_size"
    assert spec.command.roles.accum_steps == "accumulate_grad_batches"
    run_dir = tmp_path / "run"
    first = prepare_attempt(spec, "r1", run_dir, 1).record.config
    assert first is not None and first.changes == {}  # base.yaml's values, as LightningCLI reads them
    retuned = spec.model_copy(
        update={"knobs": {**spec.knobs, "batch_size": 32, "accumulate_grad_batches": 2}}
    )
    second = prepare_attempt(retuned, "r1", run_dir, 2).record.config
    assert second is not None
    assert second.changes == {"data.batch_size": (64, 32), "trainer.accumulate_grad_batches": (1, 2)}
    assert "data:\n  batch_size: 32" in Path(second.path).read_text()  # read after base.yaml: it wins
    assert unnamed_batch_warning(spec) is None
    assert complete_command(spec) == spec  # a completed spec names exp.yaml by its placeholder


def test_a_config_file_read_before_another_has_its_batch_size_unbound_and_said_so(tmp_path: Path) -> None:
    spec = _composed(tmp_path, ["exp.yaml", "base.yaml"])  # base.yaml would override the copy
    assert spec.command is not None and spec.command.roles.micro_batch is None
    said = unnamed_batch_warning(spec)
    assert said is not None and said.startswith(
        "the lightning preset found no batch size in the command's flags or exp.yaml, so an out-of-memory"
    )


def test_a_lightning_restart_takes_last_ckpt_over_an_older_best_k_file(tmp_path: Path) -> None:
    # ModelCheckpoint(monitor="val_loss", save_top_k=1, save_last=True): the best checkpoint (step 30)
    # stays while training goes on; last.ckpt, with no step in its name, holds step 40.
    spec = _command(
        ["python", "fit.py", "--batch-size", "16", "--default_root_dir", "runs"],
        "lightning",
        cwd=str(tmp_path),
    )
    run_dir = tmp_path / "run"
    prepare_attempt(spec, "r1", run_dir, 1)
    folder = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    best, last = folder / "epoch=2-step=30.ckpt", folder / "last.ckpt"
    best.write_text("step 30")
    last.write_text("step 40")
    started = time.time()  # both written after the first attempt started, the best one first
    os.utime(best, (started + 10, started + 10))
    os.utime(last, (started + 20, started + 20))
    second = prepare_attempt(spec, "r1", run_dir, 2)
    assert second.argv[-2:] == ["--ckpt_path", str(last)]
    assert second.note == f"attempt 2 resumes from {last}"


def test_a_checkpoint_pattern_inside_the_output_folder_follows_its_knob(tmp_path: Path) -> None:
    # nanoGPT's shape: `--out_dir=out` and its one checkpoint file, out/ckpt.pt.
    argv = ["python", "train.py", "--batch_size=64", "--out_dir=./out/", "{resume_from?--init_from=resume}"]
    knobs = {"batch_size": 64, "out_dir": "./out/"}
    roles = {"micro_batch": "batch_size", "output_dir": "out_dir"}
    argv[2:4] = ["--batch_size={batch_size}", "--out_dir={out_dir}"]
    spec = _command(argv, "none", knobs, roles=roles, checkpoints={"glob": "out/ckpt.pt"}, cwd=str(tmp_path))
    assert spec.command is not None and spec.command.checkpoints is not None
    assert spec.command.checkpoints.glob == "{out_dir}/ckpt.pt"
    # Run again into another folder: the restart looks there, not in the first run's.
    other = spec.model_copy(update={"knobs": {**spec.knobs, "out_dir": "elsewhere"}})
    run_dir = tmp_path / "run"
    prepare_attempt(other, "r1", run_dir, 1)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "ckpt.pt").write_text("x")
    second = prepare_attempt(other, "r1", run_dir, 2)
    assert second.argv[-1] == "--init_from=resume" and second.note.endswith("elsewhere/ckpt.pt")
    # A pattern elsewhere, or one written with the knob already, is left as it is.
    for pattern in ("ckpts/*.pt", "{out_dir}/best.pt", "outer/ckpt.pt"):
        kept = _command(argv, "none", knobs, roles=roles, checkpoints={"glob": pattern}, cwd=str(tmp_path))
        assert kept.command is not None and kept.command.checkpoints is not None
        assert kept.command.checkpoints.glob == pattern


def test_a_checkpoint_pattern_follows_an_output_folder_named_in_the_config_file(tmp_path: Path) -> None:
    # A plain script whose YAML says `out_dir: ckpts`: the knob's value comes from the file.
    config = tmp_path / "config.yaml"
    config.write_text("train:\n  batch_size: 64\n  grad_accum: 1\nout_dir: ckpts\n")
    spec = _command(
        ["python", "train.py", "--config", str(config)],
        "none",
        config_file=str(config),
        bind={
            k: {"config": key}
            for k, key in (("bs", "train.batch_size"), ("ga", "train.grad_accum"), ("out", "out_dir"))
        },
        roles={"micro_batch": "bs", "accum_steps": "ga", "output_dir": "out"},
        checkpoints={"glob": "ckpts/step_*.pt"},
        cwd=str(tmp_path),
    )
    assert spec.knobs["out"] == "ckpts"
    assert spec.command is not None and spec.command.checkpoints is not None
    assert spec.command.checkpoints.glob == "{out}/step_*.pt"


def test_a_trainer_command_that_leaves_the_evaluation_batch_at_its_default_can_have_it_lowered(
    tmp_path: Path,
) -> None:
    spec = _command(
        ["python", "ft.py", "--per_device_train_batch_size", "8", "--eval_strategy", "steps"], "transformers"
    )
    first = prepare_attempt(spec, "r", tmp_path / "run", 1)
    assert "--per_device_eval_batch_size" not in first.argv  # the Trainer's own default, untouched
    decision = RetuneDecision("reduce_eval_batch", {"eval_batch_size": (8, 4)})
    doc, before, after = apply_decision(spec, decision)
    assert (before, after) == (
        {"knobs.per_device_eval_batch_size": 8},
        {"knobs.per_device_eval_batch_size": 4},
    )
    second = prepare_attempt(spec_from_mapping(doc), "r", tmp_path / "run", 2)
    at = second.argv.index("--per_device_eval_batch_size")
    assert second.argv[at + 1] == "4"
