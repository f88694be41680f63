"""The image training runner (residual CNN): restoration and keypoints, synthetic and folder data."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.core.events import EXIT_OK
from tests.runners.conftest import RunResult, RunRunner, load_final_weights, report_of, run_attempt

# Every test here trains a real model: the inner loop (`make test-fast`) leaves them out.
pytestmark = pytest.mark.slow


def image_section(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task": "image",
        "image": {
            "mode": "restoration",
            "base_channels": 8,
            "num_blocks": 2,
            "patch_size": 24,
            "synthetic_samples": 40,
        },
        "batch_size": 4,
        "grad_accum_steps": 2,
        "max_steps": 6,
        "log_interval": 3,
        "checkpoint_interval": 3,
        "seed": 3,
    }
    base.update(overrides)
    return base


def assert_trained_to_finished(result: RunResult, mode: str, source: str, workers: int) -> None:
    assert result.rc == EXIT_OK, result.stderr
    started = result.one("started")
    assert started["task"] == "image" and started["config"]["resolved"]["mode"] == mode
    assert started["config"]["resolved"]["source"] == source
    assert started["config"]["resolved"]["num_workers"] == workers
    assert started["config"]["resolved"]["pin_memory"] is False
    progress = result.of_type("progress")
    assert [p["step"] for p in progress] == [1, 3, 6]
    assert all(p["loss"] is not None and p["loss"] > 0 and p["samples_per_s"] > 0 for p in progress)
    report = report_of(result.run_dir)
    assert report["steps"] == 6 and report["samples_seen"] == 48 and report["tokens_seen"] is None
    assert (result.run_dir / "outputs" / "model" / "model.pt").is_file()


REFERENCE = image_section(gradient_checkpointing=True, channels_last=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """Restoration on synthetic data, gradient checkpointing and channels_last on: a task trained to
    the end, and the uninterrupted run the resume test compares with."""
    return run_attempt(REFERENCE, tmp_path_factory.mktemp("reference") / "run")


def test_restoration_with_checkpointing_and_channels_last_trains_to_finished(reference: RunResult) -> None:
    assert_trained_to_finished(reference, "restoration", "synthetic", 0)


@pytest.mark.parametrize(
    ("mode", "data"), [("keypoints", None), ("restoration", "images"), ("keypoints", "keypoint_images")]
)
def test_image_task_trains_to_finished(
    run_runner: RunRunner, image_assets: dict[str, Path], mode: str, data: str | None
) -> None:
    image = {"mode": mode, "base_channels": 8, "num_blocks": 2, "patch_size": 24, "num_keypoints": 3}
    section = image_section(image=image, data=str(image_assets[data]) if data else None)
    if data == "images":
        # the DataLoader worker path: two workers, pinned memory requested (ignored on a CPU)
        section.update(num_workers=2, pin_memory=True, persistent_workers=True, prefetch_factor=2)
    result = run_runner(section)
    source = str(image_assets[data]) if data else "synthetic"
    assert_trained_to_finished(result, mode, source, 2 if data == "images" else 0)


def test_image_resume_exact_and_with_other_micro_batches(reference: RunResult, tmp_path: Path) -> None:
    """Gradient checkpointing and channels_last on: resuming the reference from its step-3
    checkpoint with the same micro-batch is bitwise equal; with 2×4 instead of 4×2 (a retune's
    direction), equal within float tolerance."""
    assert reference.rc == EXIT_OK, reference.stderr
    expected = load_final_weights(reference.run_dir)
    for micro, accum in [(4, 2), (2, 4)]:
        run_dir = tmp_path / f"resumed-{micro}x{accum}"
        shutil.copytree(reference.run_dir / "checkpoints" / "00000003", run_dir / "checkpoints" / "00000003")
        result = run_attempt({**REFERENCE, "batch_size": micro, "grad_accum_steps": accum}, run_dir)
        assert result.rc == EXIT_OK, result.stderr
        assert result.one("started")["samples_seen"] == 24
        weights = load_final_weights(run_dir)
        for name, ref in expected.items():
            if micro == 4:
                assert torch.equal(weights[name], ref), name
            else:
                torch.testing.assert_close(
                    weights[name], ref, rtol=1e-5, atol=1e-6, msg=f"{micro}x{accum} {name}"
                )
