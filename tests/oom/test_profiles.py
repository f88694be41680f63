"""Memory-tier profiles: tier choice, the published tiers' values, and that every row is a valid spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.config.spec_infer import InferSpec
from gpuwarden.core.config.spec_train import TrainSpec
from gpuwarden.core.errors import ConfigError, UserError
from gpuwarden.core.oom.classify import parse_size
from gpuwarden.core.oom.profiles import PACKAGE_PROFILES, load_profile_table, profile_for, tier_for

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
MiB = 1 << 20


def test_the_package_ships_the_table_once() -> None:
    assert PACKAGE_PROFILES.is_file() and not (REPO / "configs" / "profiles.yaml").exists()


@pytest.mark.parametrize(
    ("memory", "tier"),
    [
        (8188 * MiB, "8 GB"),  # an "8 GB" card as NVML reports it
        (10240 * MiB, "8 GB"),  # RTX 3080 10 GB
        (12288 * MiB, "12 GB"),
        (16380 * MiB, "16 GB"),  # RTX 4060 Ti 16 GB
        (24564 * MiB, "24 GB"),  # RTX 4090
        (40960 * MiB, "40 GB"),
        (49140 * MiB, "40 GB"),  # RTX A6000 48 GB: the 40/48 tier
        (81559 * MiB, "80 GB"),  # H100 80 GB reports 79.6 GiB
        (143771 * MiB, "141 GB"),  # H200
        (4 * GiB, "below 8 GB"),
    ],
)
def test_tier_choice(memory: int, tier: str) -> None:
    assert profile_for(memory, "infer", "image_to_text")["tier"] == tier


def test_image_to_text_inference_preset_by_card_memory() -> None:
    rows = {
        8: ({"0": "7GiB"}, "fp16", 512, 262144),
        12: ({"0": "11GiB"}, "fp16", 1024, 524288),
        16: ({"0": "15GiB"}, "auto", 1024, 786432),
        24: ({"0": "23GiB"}, "bf16", 2048, 1048576),
    }
    for gb, (max_memory, precision, tokens, pixels) in rows.items():
        p = profile_for(gb * GiB, "infer", "image_to_text")
        assert (p["max_memory"], p["precision"], p["max_new_tokens"], p["max_pixels"]) == (
            max_memory,
            precision,
            tokens,
            pixels,
        )


def test_image_restoration_presets_by_card_memory() -> None:
    for gb, batch, channels in ((8, 16, 64), (12, 32, 96), (16, 48, 96), (24, 64, 128)):
        p = profile_for(gb * GiB, "train", "image")
        assert (p["batch_size"], p["image"]["base_channels"]) == (batch, channels)


def test_causal_lm_presets_keep_the_effective_batch_across_tiers() -> None:
    tiers = [8, 12, 16, 24, 40, 80, 141]
    effective = {
        profile_for(gb * GiB, "train", "causal_lm")["batch_size"]
        * profile_for(gb * GiB, "train", "causal_lm")["grad_accum_steps"]
        for gb in tiers
    }
    assert effective == {16}
    assert profile_for(12 * GiB, "train", "causal_lm")["gradient_checkpointing"] is True


def test_budget_never_exceeds_a_small_card() -> None:
    p = profile_for(4 * GiB, "infer", "image_to_text")
    assert parse_size(p["max_memory"]["0"]) <= 4 * GiB - 768 * MiB


def test_profile_is_a_copy() -> None:
    p = profile_for(16 * GiB, "infer", "image_to_text")
    p["max_memory"]["0"] = "1GiB"
    assert profile_for(16 * GiB, "infer", "image_to_text")["max_memory"] == {"0": "15GiB"}


@pytest.mark.parametrize("gb", [8, 12, 16, 24, 40, 80, 141])
def test_every_row_is_a_valid_spec_section(gb: int) -> None:
    train_base: dict[str, dict[str, Any]] = {
        "causal_lm": {"task": "causal_lm", "model": "m", "data": "d.jsonl"},
        "image": {"task": "image"},
    }
    for task, base in train_base.items():
        row = {k: v for k, v in profile_for(gb * GiB, "train", task).items() if k != "tier"}
        TrainSpec.model_validate({**base, **row})
    for task in ("generate", "image_to_text"):
        row = {k: v for k, v in profile_for(gb * GiB, "infer", task).items() if k != "tier"}
        InferSpec.model_validate({"task": task, "model": "m", "input": "i", **row})


def test_unknown_kind_or_task() -> None:
    with pytest.raises(UserError, match="use train or infer"):
        profile_for(16 * GiB, "command", "x")
    with pytest.raises(UserError, match="did you mean 'image_to_text'"):
        profile_for(16 * GiB, "infer", "image_to_txt")
    with pytest.raises(UserError, match="positive"):
        profile_for(0, "infer", "generate")


def test_table_must_ascend(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("tiers:\n  - gb: 16\n  - gb: 8\n")
    with pytest.raises(ConfigError, match="ascending"):
        load_profile_table(path)
    path.write_text("tiers:\n  - gb: 8\n    infer:\n      chat: {}\n")
    with pytest.raises(ConfigError):
        load_profile_table(path)


def test_tier_for_custom_table(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("tiers:\n  - gb: 8\n  - gb: 16\n")
    table = load_profile_table(path)
    assert tier_for(15 * GiB + 600 * MiB, table).gb == 16
    assert tier_for(15 * GiB, table).gb == 8
