"""A recovery probe measures what the restarted attempt will do: it resumes from the run's own
checkpoint, holds the attempt's accumulation, writes a checkpoint between its steps, and leaves
the run's checkpoints as they were."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.core.checkpoints import find_latest_checkpoint, link_checkpoint, list_checkpoints
from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.tune.probe import SubprocessProber
from gpuwarden.core.tune.search import Candidate

PINNED = {"OMP_NUM_THREADS": "1"}
SPEC: dict[str, Any] = {
    "name": "resumed",
    "kind": "train",
    "env": PINNED,
    "resources": {"gpus": 0, "memory_limit": 8 * 2**30},
    "train": {
        "task": "image",
        "batch_size": 4,
        "grad_accum_steps": 2,
        "max_steps": 3,
        "checkpoint_interval": 1,
        "log_interval": 1,
        "image": {"base_channels": 8, "num_blocks": 1, "patch_size": 32, "synthetic_samples": 32},
    },
}


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_link_checkpoint_shares_files_without_touching_them(tmp_path: Path) -> None:
    source = tmp_path / "run" / "checkpoints" / "00000003"
    source.mkdir(parents=True)
    (source / "model.pt").write_bytes(b"weights")
    (source / "meta.json").write_text(json.dumps({"step": 3}))
    linked = link_checkpoint(source, tmp_path / "probe" / "checkpoints")
    assert find_latest_checkpoint(tmp_path / "probe" / "checkpoints") == linked
    assert (linked / "model.pt").stat().st_ino == (source / "model.pt").stat().st_ino
    (linked / "model.pt").unlink()  # what pruning does in the probe's folder
    assert (source / "model.pt").read_bytes() == b"weights"


def test_probe_spec_continues_after_the_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "checkpoints" / "00000007"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 7}))
    spec = spec_from_mapping(SPEC)
    prober = SubprocessProber(spec, tmp_path / "work", resume_from=ckpt, include_saves=True)
    probe_spec = prober._probe_spec(Candidate(2, 4, "auto", False), tmp_path / "work" / "p")
    train = probe_spec["train"]
    assert train["max_steps"] == 7 + prober.warmup_steps + prober.measure_steps
    assert train["checkpoint_interval"] == 1 and (train["batch_size"], train["grad_accum_steps"]) == (2, 4)
    plain = SubprocessProber(spec, tmp_path / "work")._probe_spec(Candidate(2, 4, "auto", False), tmp_path)
    assert plain["train"]["max_steps"] == 5 and plain["train"]["checkpoint_interval"] == 10**9


@pytest.mark.slow
def test_a_probe_resumes_from_the_runs_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec_path = run_dir / "spec.yaml"
    first = {**SPEC, "train": {**SPEC["train"], "max_steps": 1}}
    spec_path.write_text(yaml.safe_dump(first))
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec_path), "--run-dir", str(run_dir)],
        env={**os.environ, **PINNED},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    checkpoint = find_latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None
    before = _digest(checkpoint)

    prober = SubprocessProber(
        spec_from_mapping(SPEC),
        run_dir / "probes" / "after-1",
        env={**os.environ, **PINNED},
        warmup_steps=1,
        measure_steps=1,
        resume_from=checkpoint,
        include_saves=True,
    )
    result = prober(Candidate(2, 4, "auto", False))
    assert result.ok and result.mem_peak is not None, result
    events_file = run_dir / "probes" / "after-1" / "probe-1" / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    started = next(e for e in events if e["type"] == "started")
    assert started["resumed_from"] and "probe-1" in started["resumed_from"]
    steps = [e["step"] for e in events if e["type"] == "progress"]
    assert steps == [2, 3]  # after the checkpoint's step 1
    assert any(e["type"] == "checkpoint" and e["step"] == 2 for e in events)  # a save between the steps
    assert list_checkpoints(run_dir / "checkpoints") == [checkpoint] and _digest(checkpoint) == before
