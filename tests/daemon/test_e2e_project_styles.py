"""Projects recovered end to end as their users run them, with the settings where those projects
keep them: a LightningCLI project (`python main.py fit --config config.yaml`, everything in one
YAML), a Hydra script (`python train.py training.batch_size=64`, overrides on the command
line) and a loop of its own on Accelerate (`accelerate launch train.py
--per_device_train_batch_size 16`, checkpoints by `accelerator.save_state`). A real daemon, a real allocation failure under an address-space limit, the final weights
compared with the same project run uninterrupted at the original micro-batch.

LightningCLI saves the config it ran with in the trainer's log folder and refuses to start where
one exists: without a logger that folder is the same at every start, so the restart would be
refused by the file attempt 1 saved, and the run would end failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.daemon.conftest import DaemonHandle
from tests.daemon.module_daemon import module_daemon

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
# LightningCLI: micro-batch 64 needs about 1.4 GiB of address space from epoch 3 on, 32 about 1.15.
LIGHTNING_LIMIT = "1300MiB"
# Hydra: micro-batch 64 needs about 1.3 GiB from step 9 on, 32 under 1.05 GiB.
HYDRA_LIMIT = "1200MiB"
# Accelerate: micro-batch 16 needs about 1.2 GiB once the texts grow long (step 4), 8 about 1.1, 4
# under 1.05: the run recovers at 8 × 2, or at 4 × 4 where 8 runs out too.
ACCELERATE_LIMIT = "1100MiB"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


def _project(example: str, folder: Path) -> Path:
    shutil.copytree(EXAMPLES / example, folder)
    return folder


def _weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _plain(folder: Path, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run the project as its user would, without gpuwarden and without a memory limit."""
    own = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=folder,
        env={**own, **PINNED, **(env or {})},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _assert_same_weights(got: Path, want: Path) -> None:
    recovered, reference = (_weights(p) for p in (got, want))
    assert recovered.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_a_lightning_cli_project_restarts_past_the_config_its_first_attempt_saved(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    folder = _project("lightning_cli", tmp_path / "project")
    users_config = (folder / "config.yaml").read_text()
    argv = ["--", sys.executable, "main.py", "fit", "--config", "config.yaml"]
    run = [
        "run",
        "--framework",
        "lightning",
        "--config-file",
        "config.yaml",
        "--memory-limit",
        LIGHTNING_LIMIT,
    ]
    result = gw.cli(*run, "--name", "lcli", "--follow", *argv, env=PINNED, cwd=folder, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with gw.client() as client:
        detail = client.run("lcli")
    assert [a.classification for a in detail.attempts] == ["oom", "succeeded"]
    _, second = detail.attempts
    assert second.prepared is not None and second.prepared.config is not None
    assert second.prepared.resume_from == str(folder / "out" / "ckpt" / "epoch=2-step=3.ckpt")
    # Only the retuned keys and the checkpoint differ from the user's file, its indentation kept.
    changed = [line for line in second.prepared.config.diff.splitlines() if line[:1] in "+-"][2:]
    assert changed == [
        "-  accumulate_grad_batches: 1",
        "+  accumulate_grad_batches: 2",
        "-  batch_size: 64   # per device",
        "+  batch_size: 32   # per device",
        f"+ckpt_path: {second.prepared.resume_from}",
    ]
    kept = Path(detail.run_dir) / "attempts" / "1" / "lightning-saved-config.yaml"
    assert "batch_size: 64" in kept.read_text()  # what attempt 1 ran with, kept
    assert "batch_size: 32" in (folder / "out" / "config.yaml").read_text()  # attempt 2's own
    assert f"{folder / 'out' / 'config.yaml'} → {kept}" in (second.prepared.resume_note or "")
    assert (folder / "config.yaml").read_text() == users_config

    shown = gw.cli("show", "lcli", cwd=folder).stdout
    assert "the config LightningCLI saved in attempt 1 moved aside" in shown
    assert "resumed mid-epoch" not in shown  # an end-of-epoch checkpoint resumes exactly

    reference = _project("lightning_cli", tmp_path / "reference")
    _plain(reference, ["main.py", "fit", "--config", "config.yaml"])
    _assert_same_weights(folder / "out" / "final.pt", reference / "out" / "final.pt")


@pytest.mark.slow
def test_the_lightning_callback_named_in_the_config_reports_without_a_line_of_code(tmp_path: Path) -> None:
    folder = _project("lightning_cli", tmp_path / "project")
    config = (folder / "config.yaml").read_text()
    entry = "    - class_path: gpuwarden.sdk.lightning.GpuwardenCallback\n"
    (folder / "config.yaml").write_text(
        config.replace("        save_top_k: -1\n", "        save_top_k: -1\n" + entry)
    )
    events = tmp_path / "events.jsonl"  # what the daemon gives each attempt
    argv = ["main.py", "fit", "--config", "config.yaml", "--trainer.max_epochs", "2"]
    _plain(folder, argv, {"GPUWARDEN_EVENTS_FILE": str(events)})
    reported = [json.loads(line) for line in events.read_text().splitlines()]
    steps = [(e["step"], e["samples_seen"]) for e in reported if e["type"] == "progress"]
    assert steps == [(1, 64), (2, 128)]
    assert [e["type"] for e in reported].count("fixed_memory") == 1


@pytest.mark.slow
def test_a_hydra_script_is_retuned_through_its_overrides_and_resumed(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    folder = _project("hydra", tmp_path / "project")
    overrides = ["training.batch_size=64", "training.grad_accum=1", "training.resume={resume_from?}"]
    roles = ["--role", "micro_batch=training.batch_size", "--role", "accum_steps=training.grad_accum"]
    run = ["run", "--name", "hydra", "--memory-limit", HYDRA_LIMIT, *roles, "--checkpoints", "out/step_*.pt"]
    result = gw.cli(*run, "--follow", "--", sys.executable, "train.py", *overrides, env=PINNED, cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with gw.client() as client:
        detail = client.run("hydra")
    assert [a.classification for a in detail.attempts] == ["oom", "succeeded"]
    (retune,) = detail.retunes
    assert retune.after == {"knobs.batch_size": 32, "knobs.grad_accum": 2}
    first, second = (a.prepared for a in detail.attempts)
    assert first is not None and second is not None
    assert first.argv[2:] == ["training.batch_size=64", "training.grad_accum=1"]  # no checkpoint yet
    checkpoint = str(folder / "out" / "step_8.pt")
    assert second.argv[2:] == [
        "training.batch_size=32",
        "training.grad_accum=2",
        f"training.resume={checkpoint}",
    ]
    assert f"resumed from {checkpoint} at step 8" in gw.cli("logs", "hydra", cwd=folder).stdout

    reference = _project("hydra", tmp_path / "reference")
    _plain(reference, ["train.py"])
    _assert_same_weights(folder / "out" / "final.pt", reference / "out" / "final.pt")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpuwarden.runners.testing_models import build_example_assets

    root = tmp_path_factory.mktemp("assets")
    build_example_assets(root)
    return root


def _accelerate_args(assets: Path) -> list[str]:
    return [
        "train.py",
        "--model_name_or_path", str(assets / "train-lm"),
        "--train_file", str(assets / "ramp-texts.jsonl"),
        "--per_device_train_batch_size", "16",
        "--output_dir", "out",
    ]  # fmt: skip


@pytest.mark.slow
def test_an_accelerate_loop_resumes_from_the_folders_save_state_wrote(
    gw: DaemonHandle, assets: Path, tmp_path: Path
) -> None:
    folder = _project("accelerate", tmp_path / "project")
    launch = [str(Path(sys.executable).parent / "accelerate"), "launch", "--num_processes", "1"]
    argv = [*launch, *_accelerate_args(assets), "--checkpointing_steps", "1"]
    run = ["run", "--framework", "accelerate", "--memory-limit", ACCELERATE_LIMIT, "--name", "acc"]
    result = gw.cli(*run, "--follow", "--", *argv, env=PINNED, cwd=folder, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with gw.client() as client:
        detail = client.run("acc")
    outcomes = [a.classification for a in detail.attempts]
    assert outcomes[0] == "oom" and outcomes[-1] == "succeeded" and set(outcomes[1:-1]) <= {"oom"}, outcomes
    prepared = [a.prepared for a in detail.attempts]
    assert all(p is not None for p in prepared)
    sizes = [
        (p.knobs["per_device_train_batch_size"], p.knobs["gradient_accumulation_steps"])
        for p in prepared
        if p
    ]
    assert sizes[0] == (16, 1) and all(micro * accum == 16 for micro, accum in sizes), sizes
    # The texts grow long at step 4: attempt 1 wrote step_1 … step_3 and ran out in step 4.
    second = prepared[1]
    assert second is not None and second.resume_from == str(folder / "out" / "step_3")
    assert second.argv[-2:] == ["--resume_from_checkpoint", str(folder / "out" / "step_3")]
    logs = gw.cli("logs", "acc", "--attempt", "2", cwd=folder).stdout
    assert f"Resumed from checkpoint: {folder / 'out' / 'step_3'}" in logs
    assert "step 4 loss" in logs and "step 1 loss" not in logs
    shown = gw.cli("show", "acc", cwd=folder).stdout
    assert "resumed from step_3 with accumulation 2, written with 1" in " ".join(shown.split())

    # The example resets Accelerate's micro-batch counter after load_state: the recovered run
    # trained on the same batches as one that never ran out of memory.
    reference = _project("accelerate", tmp_path / "reference")
    _plain(reference, _accelerate_args(assets))
    _assert_same_weights(folder / "out" / "model.safetensors", reference / "out" / "model.safetensors")
