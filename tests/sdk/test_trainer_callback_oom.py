"""The Hugging Face Trainer callback at a real out-of-memory: the example script runs out of
address space in step 4 (long texts at micro-batch 16 under 1.8 GiB), the callback saves the
Trainer's checkpoint of step 3 — past the last one `save_steps` wrote (step 2) — writes the
`checkpoint` and `oom` events and exits 3, and a restart from that checkpoint runs only step 4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.rlimit import limited_argv
from gpuwarden.runners.testing_models import build_tiny_causal_lm, write_ramp_texts
from gpuwarden.sdk import EXIT_OOM

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "hf_trainer" / "finetune.py"
LIMIT = int(1.8 * 2**30)  # as configs/examples/own-script-hf-cpu.yaml sets it
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}


def _run(argv: list[str], events: Path, limit: int | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env.update(PINNED, GPUWARDEN_EVENTS_FILE=str(events), PYTHONPATH=str(REPO))
    return subprocess.run(
        limited_argv(argv, limit), cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_trainer_callback_saves_the_last_completed_step_at_a_real_oom(tmp_path: Path) -> None:
    model = build_tiny_causal_lm(tmp_path / "train-lm", hidden=64, layers=2, vocab=512)
    texts = write_ramp_texts(tmp_path / "ramp-texts.jsonl", short=48, long=32, seed=4)
    out = tmp_path / "out"
    common = [
        sys.executable, str(SCRIPT), "--model", str(model), "--data", str(texts),
        "--output_dir", str(out), "--max_steps", "4", "--save_steps", "2", "--logging_steps", "1",
        "--train_sampling_strategy", "sequential", "--learning_rate", "1e-3", "--use_cpu", "true",
        "--report_to", "none", "--disable_tqdm", "true", "--gpuwarden_callback", "true",
    ]  # fmt: skip
    first = tmp_path / "attempt-1.jsonl"
    done = _run([*common, "--per_device_train_batch_size", "16"], first, LIMIT)
    assert done.returncode == EXIT_OOM, done.stderr[-3000:]
    assert "can't allocate memory" in done.stderr  # a real allocation failure, not a simulated one
    events = _events(first)
    saved = [e for e in events if e["type"] == "checkpoint" and e.get("reason") == "oom"]
    (oom,) = [e for e in events if e["type"] == "oom"]
    assert oom["verdict"] == "host_oom" and oom["step"] == 3
    assert saved and saved[0]["step"] == 3 and saved[0]["samples_seen"] == 48
    assert oom["checkpoint"] == saved[0]["path"] == str(out / "checkpoint-3")
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()
    # Before the first step the callback said what the model holds whatever the batch.
    (fixed,) = [e for e in events if e["type"] == "fixed_memory"]
    assert fixed["device"] == "cpu" and fixed["parameters"] > 0 and fixed["held_bytes"] > 0
    assert events.index(fixed) < next(i for i, e in enumerate(events) if e["type"] == "progress")

    # The restart, at the retune's 8 × 2, starts from step 3: it trains step 4 alone.
    second = tmp_path / "attempt-2.jsonl"
    resumed = [
        *common, "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
        "--resume_from_checkpoint", str(out / "checkpoint-3"),
    ]  # fmt: skip
    done = _run(resumed, second, LIMIT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [e["step"] for e in _events(second) if e["type"] == "progress"] == [4]
