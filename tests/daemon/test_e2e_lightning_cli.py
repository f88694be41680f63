"""A LightningCLI project recovered end to end, submitted the way its user runs it: `gpuwarden run
--framework lightning --config-file config.yaml -- python main.py fit --config config.yaml`. A
real daemon, a real allocation failure under an address-space limit, the final weights compared
with the same project run uninterrupted at the original micro-batch.

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

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "lightning_cli"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
# Micro-batch 64 needs about 1.4 GiB of address space from epoch 3 on, 32 about 1.15 GiB.
LIMIT = "1300MiB"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


def _project(folder: Path) -> Path:
    folder.mkdir()
    for name in ("main.py", "config.yaml"):
        shutil.copy(PROJECT / name, folder / name)
    return folder


def _uninterrupted(folder: Path) -> dict[str, torch.Tensor]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    done = subprocess.run(
        [sys.executable, "main.py", "fit", "--config", "config.yaml"],
        cwd=folder,
        env={**env, **PINNED},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = torch.load(folder / "out" / "final.pt", weights_only=True)
    assert isinstance(state, dict)
    return state


@pytest.mark.slow
def test_a_lightning_cli_project_restarts_past_the_config_its_first_attempt_saved(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    folder = _project(tmp_path / "project")
    users_config = (folder / "config.yaml").read_text()
    argv = ["--", sys.executable, "main.py", "fit", "--config", "config.yaml"]
    run = ["run", "--framework", "lightning", "--config-file", "config.yaml", "--memory-limit", LIMIT]
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

    reference = _uninterrupted(_project(tmp_path / "reference"))
    recovered = torch.load(folder / "out" / "final.pt", weights_only=True)
    assert recovered.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_the_lightning_callback_named_in_the_config_reports_without_a_line_of_code(tmp_path: Path) -> None:
    folder = _project(tmp_path / "project")
    config = (folder / "config.yaml").read_text()
    entry = "    - class_path: gpuwarden.sdk.lightning.GpuwardenCallback\n"
    (folder / "config.yaml").write_text(
        config.replace("        save_top_k: -1\n", "        save_top_k: -1\n" + entry)
    )
    events = tmp_path / "events.jsonl"  # what the daemon gives each attempt
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    done = subprocess.run(
        [sys.executable, "main.py", "fit", "--config", "config.yaml", "--trainer.max_epochs", "2"],
        cwd=folder,
        env={**env, **PINNED, "GPUWARDEN_EVENTS_FILE": str(events)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reported = [json.loads(line) for line in events.read_text().splitlines()]
    steps = [(e["step"], e["samples_seen"]) for e in reported if e["type"] == "progress"]
    assert steps == [(1, 64), (2, 128)]
    assert [e["type"] for e in reported].count("fixed_memory") == 1
