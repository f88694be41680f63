"""Settings passed as overrides (`training.batch_size=64`, as Hydra takes them) or as dotted
flags (`--data.batch_size 64`): a role names one, and it becomes a knob a retune can change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.core.command.batch_hint import unnamed_batch_warning
from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.config.argv_flags import knob_for, override_setting, valued_flags
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.oom.recovery import apply_decision
from gpuwarden.core.oom.retune import RetuneDecision


def _spec(argv: list[str], roles: dict[str, Any]) -> RunSpec:
    command = {"argv": argv, "roles": roles}
    return complete_command(spec_from_mapping({"name": "h", "kind": "command", "command": command}))


def test_hydra_overrides_named_by_roles_become_knobs_and_a_retune_rewrites_them(tmp_path: Path) -> None:
    argv = ["python", "train.py", "training.batch_size=64", "++training.grad_accum=1", "model.width=1024"]
    spec = _spec(argv, {"micro_batch": "training.batch_size", "accum_steps": "training.grad_accum"})
    assert spec.command is not None
    assert spec.command.argv[2:] == [
        "training.batch_size={batch_size}",
        "++training.grad_accum={grad_accum}",
        "model.width=1024",
    ]
    assert spec.knobs == {"batch_size": 64, "grad_accum": 1}
    assert spec.command.roles.knob_names() == {"micro_batch": "batch_size", "accum_steps": "grad_accum"}
    decision = RetuneDecision("halve", changes={"batch_size": (64, 32), "grad_accum": (1, 2)})
    document, _, _ = apply_decision(spec, decision)
    prepared = prepare_attempt(spec_from_mapping(document), "r1", tmp_path / "run", 2)
    assert prepared.argv[2:] == ["training.batch_size=32", "++training.grad_accum=2", "model.width=1024"]


def test_a_dotted_flag_named_by_a_role_becomes_the_knob_of_its_last_part() -> None:
    spec = _spec(
        ["python", "t.py", "--data.batch_size", "64", "--model.batch_size=2"],
        {"micro_batch": "data.batch_size"},
    )
    assert spec.command is not None
    assert spec.command.argv[2:] == ["--data.batch_size", "{batch_size}", "--model.batch_size=2"]
    assert spec.knobs == {"batch_size": 64} and spec.command.roles.micro_batch == "batch_size"


def test_what_reads_as_an_override_and_the_knob_it_becomes() -> None:
    assert override_setting("training.batch_size=64") == ("", "training.batch_size", "64")
    assert override_setting("+trainer.max_steps=10") == ("+", "trainer.max_steps", "10")
    assert override_setting("x.y={bs}") is None  # a knob in place already
    assert override_setting("--x=1") is None and override_setting("a b=1") is None
    assert valued_flags(["python", "t.py", "a.b=1", "--c", "2"]) == {"a.b", "c"}
    assert knob_for("data.batch_size", set()) == "batch_size"
    assert knob_for("data.batch_size", {"batch_size"}) == "data_batch_size"


def test_an_override_that_reads_as_the_batch_size_is_pointed_out_at_submit() -> None:
    spec = _spec(["python", "train.py", "training.batch_size=64"], {})
    said = unnamed_batch_warning(spec)
    assert said is not None and "--role micro_batch=training.batch_size" in said


def test_a_lightning_project_run_through_hydra_gets_its_settings_as_overrides(tmp_path: Path) -> None:
    argv = [
        "python",
        "train.py",
        "data.batch_size=64",
        "trainer.default_root_dir=logs",
        "trainer.max_epochs=3",
    ]
    command = {"argv": argv, "framework": "lightning", "cwd": str(tmp_path)}
    spec = complete_command(spec_from_mapping({"name": "hl", "kind": "command", "command": command}))
    assert spec.command is not None
    assert spec.command.argv[2:] == [
        "data.batch_size={batch_size}",
        "trainer.default_root_dir={default_root_dir}",
        "trainer.max_epochs=3",
        "++trainer.accumulate_grad_batches={accumulate_grad_batches}",  # no flag: Hydra takes none
        "++ckpt_path='{resume_from?}'",  # quoted: a Lightning checkpoint's name holds '='
    ]
    assert spec.knobs == {"batch_size": 64, "default_root_dir": "logs", "accumulate_grad_batches": 1}
    run_dir = tmp_path / "run"
    assert prepare_attempt(spec, "r1", run_dir, 1).argv[-1] == "++trainer.accumulate_grad_batches=1"
    checkpoint = tmp_path / "logs" / "checkpoints" / "epoch=2-step=3.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    assert prepare_attempt(spec, "r1", run_dir, 2).argv[-1] == f"++ckpt_path='{checkpoint}'"
