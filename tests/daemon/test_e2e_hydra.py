"""A Hydra script recovered end to end, submitted the way its user runs it: its settings are
overrides on the command line (`training.batch_size=64`), and roles name them. A real daemon, a
real allocation failure under an address-space limit, the final weights compared with the same
script run uninterrupted at the original micro-batch."""

from __future__ import annotations

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

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "hydra"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
# Micro-batch 64 needs about 1.3 GiB of address space from step 9 on, 32 under 1.05 GiB.
LIMIT = "1200MiB"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


def _project(folder: Path) -> Path:
    shutil.copytree(PROJECT, folder)
    return folder


@pytest.mark.slow
def test_a_hydra_script_is_retuned_through_its_overrides_and_resumed(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    folder = _project(tmp_path / "project")
    overrides = ["training.batch_size=64", "training.grad_accum=1", "training.resume={resume_from?}"]
    roles = ["--role", "micro_batch=training.batch_size", "--role", "accum_steps=training.grad_accum"]
    run = ["run", "--name", "hydra", "--memory-limit", LIMIT, *roles, "--checkpoints", "out/step_*.pt"]
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

    reference = _project(tmp_path / "reference")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=reference,
        env={**env, **PINNED},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    want = torch.load(reference / "out" / "final.pt", weights_only=True)
    got = torch.load(folder / "out" / "final.pt", weights_only=True)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
