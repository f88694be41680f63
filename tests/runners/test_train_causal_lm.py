"""The causal_lm training runner, driven as the daemon drives it: a subprocess per attempt.

One uninterrupted reference run (micro-batch 4 × accumulation 2, 12 steps, a checkpoint at step
6) is shared by the module. A run stopped by SIGTERM at step 4 and resumed with the same
micro-batch must end on its weights bit for bit; one resumed from a copy of its step-6 checkpoint
with another micro-batch, as after an OOM, within float tolerance.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.core.events import EXIT_OK, EXIT_TERMINATED
from gpuwarden.runners.pause_hook import PAUSE_ENV
from tests.runners.conftest import (
    RunResult,
    load_final_weights,
    read_events,
    report_of,
    run_attempt,
    runner_command,
    runner_env,
    wait_for_event,
    write_spec,
)

# Every test here trains a real model: the inner loop (`make test-fast`) leaves them out.
pytestmark = pytest.mark.slow

STEPS = 12
MID = 6
STOP_AT = 4  # where the SIGTERM test stops its run: before MID, so it resumes from its own checkpoint


def lm_section(assets: dict[str, Path], **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task": "causal_lm",
        "model": str(assets["lm"]),
        "data": str(assets["texts"]),
        "max_length": 48,
        "batch_size": 4,
        "grad_accum_steps": 2,
        "max_steps": STEPS,
        "log_interval": 2,
        "checkpoint_interval": MID,
        "keep_checkpoints": 3,
        "scheduler": {"schedule": "cosine", "warmup_steps": 2},
        "seed": 7,
    }
    base.update(overrides)
    return base


@pytest.fixture(scope="module")
def reference(assets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    result = run_attempt(lm_section(assets), tmp_path_factory.mktemp("reference") / "run")
    assert result.rc == EXIT_OK, result.stderr
    return result


def start_from_checkpoint(src_run: Path, step: int, dst_run: Path) -> None:
    """Start `dst_run` as if an earlier attempt had stopped right after `step`."""
    name = f"{step:08d}"
    shutil.copytree(src_run / "checkpoints" / name, dst_run / "checkpoints" / name)


def weights_at(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(
        run_dir / "checkpoints" / f"{step:08d}" / "model.pt", weights_only=True
    )
    return state


def test_causal_lm_trains_to_finished_with_report(reference: RunResult) -> None:
    started = reference.one("started")
    assert started["task"] == "causal_lm" and started["device"] == "cpu" and started["dtype"] == "fp32"
    assert "resumed_from" not in started and started["parameters"] > 0
    assert started["config"]["resolved"]["optimizer"] == "fused"
    progress = reference.of_type("progress")
    assert [p["step"] for p in progress] == [1, 2, 4, 6, 8, 10, 12]
    assert all(p["samples_seen"] == p["step"] * 8 and p["total"] == STEPS * 8 for p in progress)
    assert all(p["tokens_per_s"] > 0 and p["samples_per_s"] > 0 and p["mem_peak"] > 0 for p in progress)
    lrs = [p["lr"] for p in progress]
    assert lrs[1] == pytest.approx(3e-4) and lrs[-1] == pytest.approx(3e-5)  # warm-up, then cosine to 10 %
    reasons = [(c["step"], c["reason"]) for c in reference.of_type("checkpoint")]
    assert reasons == [(MID, "interval"), (STEPS, "final")]
    report = reference.one("finished")["report"]
    assert report == report_of(reference.run_dir)
    assert (
        report["steps"] == STEPS and report["samples_seen"] == STEPS * 8 and report["tokens_seen"] > STEPS * 8
    )
    assert report["loss_last"] < report["loss_first"]
    assert (reference.run_dir / "outputs" / "model" / "config.json").is_file()
    assert (reference.run_dir / "outputs" / "model" / "tokenizer.json").is_file()
    assert "Traceback" not in reference.stderr


def test_resume_with_other_micro_batch_matches_within_tolerance(
    reference: RunResult, assets: dict[str, Path], tmp_path: Path
) -> None:
    run_dir = tmp_path / "resumed-2x4"
    start_from_checkpoint(reference.run_dir, MID, run_dir)
    result = run_attempt(lm_section(assets, batch_size=2, grad_accum_steps=4), run_dir)
    assert result.rc == EXIT_OK, result.stderr
    assert not result.of_type("warning"), result.of_type("warning")
    weights, expected = load_final_weights(run_dir), load_final_weights(reference.run_dir)
    start = weights_at(reference.run_dir, MID)
    for name, ref in expected.items():
        torch.testing.assert_close(weights[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    # the resumed attempt really trained: its weights moved away from the checkpoint's
    assert sum(not torch.equal(weights[k], start[k]) for k in weights) == len(weights)


def test_sigterm_checkpoints_then_resume_is_bitwise_equal(
    reference: RunResult, assets: dict[str, Path], tmp_path: Path
) -> None:
    # The pause hook holds the runner inside step STOP_AT + 1 (its micro-batches drawn) until
    # the signal has arrived: the stop lands there however slow the machine is.
    run_dir = tmp_path / "stopped"
    events_path = run_dir / "attempts" / "1" / "events.jsonl"
    proc = subprocess.Popen(
        runner_command(write_spec(tmp_path / "stopped.yaml", lm_section(assets)), run_dir, 1),
        env={**runner_env(), PAUSE_ENV: f"0:{STOP_AT}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_event(events_path, lambda e: e["type"] == "progress" and e["step"] == STOP_AT, timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_TERMINATED, stderr
    events = read_events(events_path)
    ckpt = [e for e in events if e["type"] == "checkpoint"]
    assert [(c["reason"], c["step"], c["samples_seen"]) for c in ckpt] == [("sigterm", STOP_AT, STOP_AT * 8)]
    assert not [e for e in events if e["type"] == "finished"]
    assert "Traceback" not in stderr

    resumed = run_attempt(lm_section(assets), run_dir)
    assert resumed.rc == EXIT_OK, resumed.stderr
    started = resumed.one("started")
    assert started["resumed_from"] == ckpt[0]["path"] and started["samples_seen"] == STOP_AT * 8
    assert resumed.of_type("progress")[0]["step"] == STOP_AT + 1  # the abandoned step is redone
    a, b = load_final_weights(reference.run_dir), load_final_weights(run_dir)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert report_of(run_dir)["samples_seen"] == STEPS * 8
    assert report_of(run_dir)["loss_first"] == report_of(reference.run_dir)["loss_first"]
