"""`profile: auto` on a user's own program: the tier's split of its effective batch, nothing else."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.oom.profile_command import command_profile

GiB = 1 << 30


def _trainer(*flags: str, **command: Any) -> RunSpec:
    return complete_command(
        spec_from_mapping(
            {
                "name": "p",
                "kind": "command",
                "command": {"argv": ["python", "ft.py", *flags], "framework": "transformers", **command},
            }
        )
    )


def test_a_large_card_takes_the_tiers_micro_batch_with_the_effective_batch_kept() -> None:
    spec = _trainer("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8")
    changes, line = command_profile(spec, 80 * GiB)  # the 80 GB causal-LM row: 16 × 1
    assert changes == {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1}
    assert line.startswith("profile 80 GB (causal_lm row, effective batch kept)")


def test_a_small_card_splits_a_large_micro_batch_and_turns_checkpointing_on() -> None:
    spec = _trainer("--per_device_train_batch_size", "24", "--gradient_checkpointing", "false")
    changes, _ = command_profile(spec, 12 * GiB)  # 12 GB row: micro-batch 1, checkpointing on
    assert changes == {
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 24,
        "gradient_checkpointing": True,
    }


def test_the_split_is_a_divisor_of_the_effective_batch() -> None:
    spec = _trainer("--per_device_train_batch_size", "6", "--gradient_accumulation_steps", "2")
    changes, _ = command_profile(spec, 40 * GiB)  # 40 GB row: 8; the largest divisor of 12 ≤ 8 is 6
    assert changes == {}


def test_a_program_the_tiers_do_not_know_keeps_its_values() -> None:
    spec = complete_command(
        spec_from_mapping(
            {
                "name": "p",
                "kind": "command",
                "command": {"argv": ["python", "fit.py", "--batch_size", "4"], "framework": "lightning"},
            }
        )
    )
    changes, line = command_profile(spec, 24 * GiB)
    assert changes == {} and "the spec's own values are used" in line
