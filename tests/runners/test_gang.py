"""Two-rank training gangs on the CPU (gloo), started by torchrun as the daemon will start them.

The data is shaped so that one rank alone meets a large shape: every text is a few words except
the eight samples rank 1 trains on in step 4, which fill `max_length` (a 32000-word vocabulary
makes their logits cost ~0.6 GB more). Under an address-space limit on every process that only
rank 1 exceeds, and only at micro-batch 8, rank 1 runs out of memory for real.

One run lives through three attempts, as a run the daemon stops, restarts and retunes would:
(a) SIGTERM to torchrun's process group stops every rank after the same step; (b) the next
attempt, under the limit, resumes from that checkpoint on every rank, and rank 1 runs out of
memory: its `oom` event, exit 3, the gang torn down; (c) the third resumes at a quarter of the
micro-batch and four times the accumulation (same effective batch) and finishes; (d) throughout,
every rank reported its own events and only rank 0 wrote checkpoints and the report. The run
trained every sample once, with both checkpoints on its way exact: it ends on the weights of one
uninterrupted process that trained the same samples step by step (each rank divides its loss by
the units of the gang's whole step, so one process over the step's samples is what the gang
computes). (e) the stall hook stops rank 1 while rank 0 waits in its collective, and SIGKILL to
torchrun takes both ranks with it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.core.events import EXIT_GANG_ABORTED, EXIT_OK, EXIT_OOM, EXIT_TERMINATED
from gpuwarden.core.gang.files import rank_logs
from gpuwarden.core.gang.outcome import read_gang_outcome
from gpuwarden.daemon.process import process_alive
from gpuwarden.runners.pause_hook import PAUSE_ENV
from gpuwarden.runners.testing_models import build_tiny_causal_lm, write_shaped_texts
from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests.runners.conftest import load_final_weights, run_attempt
from tests.runners.gang_support import Gang, start_gang, wait_for

pytestmark = pytest.mark.slow

STEPS = 6
LONG_STEP = 4  # the step whose samples on rank 1 are long
CHECKPOINT_EVERY = 3  # the last checkpoint before LONG_STEP
STOP_AT = 2  # where SIGTERM stops the second run: before CHECKPOINT_EVERY, so its resume uses that checkpoint
MICRO, WORLD = 8, 2
# Each rank maps ~1.0 GB (torch, transformers, the model); rank 1's long step at micro-batch 8
# needs ~1.7 GB, at micro-batch 2 ~1.2 GB.
LIMIT = int(1.35 * 2**30)
TIMEOUT = 300.0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gang-assets")
    texts = write_shaped_texts(
        root / "texts.jsonl",
        n=STEPS * MICRO * WORLD,
        seed=3,
        per_rank=MICRO,
        world_size=WORLD,
        long_step=LONG_STEP,
        long_rank=1,
    )
    model = build_tiny_causal_lm(root / "wide-vocab", hidden=64, layers=1, vocab=32000, seed=0)
    return {"model": model, "texts": texts}


def section(data: dict[str, Path], batch_size: int = MICRO, grad_accum_steps: int = 1) -> dict[str, Any]:
    return {
        "task": "causal_lm",
        "model": str(data["model"]),
        "data": str(data["texts"]),
        "max_length": 256,
        "batch_size": batch_size,
        "grad_accum_steps": grad_accum_steps,
        "world_size": WORLD,
        "max_steps": STEPS,
        "log_interval": 1,
        "checkpoint_interval": CHECKPOINT_EVERY,
        "keep_checkpoints": 3,
        "scheduler": {"schedule": "cosine", "warmup_steps": 1},
        "seed": 3,
    }


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    weights, expected = load_final_weights(run_dir), load_final_weights(reference)
    assert weights.keys() == expected.keys()
    for name, ref in expected.items():
        torch.testing.assert_close(weights[name], ref, rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def reference(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process trains what the gang trains, step by step: its micro-batches are the ranks'
    blocks of each step's samples, in rank order. Returns its run directory."""
    one = {**section(data, MICRO, WORLD), "world_size": 1}
    result = run_attempt(one, tmp_path_factory.mktemp("reference") / "run")
    assert result.rc == EXIT_OK, result.stderr
    return result.run_dir


@pytest.fixture(scope="module")
def stopped(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Gang:
    """Attempt 1 of the three-attempt run, stopped by SIGTERM after step STOP_AT: the pause hook
    holds rank 0 in the next step until the signal has reached it (rank 1 waits for rank 0)."""
    run_dir = tmp_path_factory.mktemp("stopped-then-oom") / "run"
    gang = start_gang(section(data), run_dir, 1, env={PAUSE_ENV: f"0:{STOP_AT}"})
    try:
        wait_for(gang, 0, lambda e: e["type"] == "progress" and e["step"] == STOP_AT, TIMEOUT)
    except AssertionError:
        gang.child.signal_tree(signal.SIGKILL)  # a paused rank would wait for ever
        raise
    os.killpg(gang.child.pid, signal.SIGTERM)  # what the daemon's stop does
    gang.wait(TIMEOUT)
    return gang


def sigterm_checkpoint(gang: Gang) -> dict[str, Any]:
    found = [e for e in gang.events()[0] if e["type"] == "checkpoint" and e["reason"] == "sigterm"]
    assert len(found) == 1, gang.events()
    return found[0]


def test_sigterm_to_the_group_stops_every_rank_at_one_step(stopped: Gang) -> None:
    events = stopped.events()
    assert sigterm_checkpoint(stopped)["step"] == STOP_AT
    for rank in (0, 1):  # both ranks stopped after the same step
        assert max(e["step"] for e in events[rank] if e["type"] == "progress") == STOP_AT
    outcome = read_gang_outcome(stopped.attempt_dir, WORLD, stopped.stderr())
    assert outcome.first_failure is None, outcome
    assert {r.exit_code for r in outcome.ranks if r.exit_code is not None} <= {EXIT_TERMINATED}


@pytest.fixture(scope="module")
def oom_run(data: dict[str, Path], stopped: Gang) -> Gang:
    """Attempt 2: under the limit, from the SIGTERM checkpoint, until rank 1's OOM."""
    gang = start_gang(section(data), stopped.attempt_dir.parents[1], 2, limit=LIMIT)
    gang.wait(TIMEOUT)
    return gang


def test_every_rank_resumes_from_the_sigterm_checkpoint(stopped: Gang, oom_run: Gang) -> None:
    ckpt = sigterm_checkpoint(stopped)
    for rank in (0, 1):
        started = next(e for e in oom_run.events()[rank] if e["type"] == "started")
        assert started["resumed_from"] == ckpt["path"]
        assert started["samples_seen"] == STOP_AT * MICRO * WORLD
        progress = [e["step"] for e in oom_run.events()[rank] if e["type"] == "progress"]
        assert progress[0] == STOP_AT + 1


def test_one_rank_runs_out_of_memory_and_torchrun_ends_the_gang(oom_run: Gang) -> None:
    status = oom_run.child.poll()
    assert status is not None and status.code == 1, oom_run.stderr()[-3000:]
    events = oom_run.events()
    oom = [e for e in events[1] if e["type"] == "oom"]
    assert len(oom) == 1, events[1]
    assert oom[0]["rank"] == 1 and oom[0]["verdict"] == "host_oom" and oom[0]["step"] == LONG_STEP - 1
    assert oom[0]["phase"] in ("forward", "backward") and oom[0]["batch_size"] == MICRO
    assert "checkpoint" not in oom[0]  # no checkpoint from a rank of a gang
    assert not [e for e in events[0] if e["type"] == "oom"]
    # rank 0 was waiting for rank 1 in a collective: it stops without a checkpoint
    aborted = [e for e in events[0] if e["type"] == "error"]
    assert [e["code"] for e in aborted] == ["gang_aborted"], events[0]
    checkpoints = sorted(p.name for p in (oom_run.attempt_dir.parents[1] / "checkpoints").iterdir())
    assert checkpoints == [f"{STOP_AT:08d}", f"{CHECKPOINT_EVERY:08d}"]  # the SIGTERM's, the interval's

    outcome = read_gang_outcome(oom_run.attempt_dir, WORLD, oom_run.stderr())
    assert outcome.first_failure is not None and outcome.first_failure.rank == 1
    by_rank = {r.rank: r for r in outcome.ranks}
    assert by_rank[1].exit_code == EXIT_OOM and by_rank[1].last_event == "oom"
    assert by_rank[0].exit_code == EXIT_GANG_ABORTED and by_rank[0].last_event == "error"
    assert "out of memory" in by_rank[1].message or "host_oom" in by_rank[1].message
    error_file = rank_logs(oom_run.attempt_dir)[1].error_file
    assert error_file.is_file() and "host_oom" in error_file.read_text(encoding="utf-8")
    # how long torchrun took from the OOM to the end of the gang (bench_gang measures it properly)
    ended = max(p.stat().st_mtime for p in oom_run.attempt_dir.glob("*.log"))
    print(f"OOM → gang ended: {ended - oom[0]['ts']:.2f} s")


@pytest.fixture(scope="module")
def finished(data: dict[str, Path], oom_run: Gang) -> Gang:
    """Attempt 3: a quarter of the micro-batch, four times the accumulation, under the limit."""
    gang = start_gang(section(data, MICRO // 4, 4), oom_run.attempt_dir.parents[1], 3, limit=LIMIT)
    gang.wait(TIMEOUT)
    return gang


def test_resume_after_the_oom_with_a_quarter_micro_batch_ends_on_one_processs_weights(
    finished: Gang, reference: Path
) -> None:
    status = finished.child.poll()
    assert status is not None and status.code == EXIT_OK, finished.stderr()[-3000:]
    events = finished.events()
    started = next(e for e in events[0] if e["type"] == "started")
    assert started["resumed_from"].endswith(f"{CHECKPOINT_EVERY:08d}")
    assert not [e for e in events[0] if e["type"] == "warning"], events[0]  # same effective batch
    report = next(e for e in events[0] if e["type"] == "finished")["report"]
    assert report["batch_size"] == MICRO // 4 and report["effective_batch"] == MICRO * WORLD
    assert report["world_size"] == WORLD and report["samples_seen"] == STEPS * MICRO * WORLD
    outcome = read_gang_outcome(finished.attempt_dir, WORLD, finished.stderr())
    assert outcome.first_failure is None
    assert [r.last_event for r in outcome.ranks] == ["finished", "progress"]
    assert_same_weights(finished.attempt_dir.parents[1], reference)


def test_every_rank_reports_its_own_events_and_only_rank_0_writes(
    stopped: Gang, oom_run: Gang, finished: Gang
) -> None:
    attempts = [stopped.events(), oom_run.events(), finished.events()]
    # the steps each attempt completed: to the stop, to the OOM, to the end
    assert [steps_of(events[0]) for events in attempts] == [[1, 2], [3], [4, 5, 6]]
    for events in attempts:
        assert sorted(events) == [0, 1]
        for rank, rank_events in events.items():
            assert all(e["rank"] == rank for e in rank_events)
            started = next(e for e in rank_events if e["type"] == "started")
            assert started["world_size"] == WORLD and started["pid"] > 0
            progress = [e for e in rank_events if e["type"] == "progress"]
            assert all(p["vm_peak"] for p in progress)  # every rank reports its own memory
            assert all(p["samples_seen"] == p["step"] * MICRO * WORLD for p in progress)  # the gang's
        # the ranks agree on the step and the loss
        assert steps_of(events[1]) == steps_of(events[0])
        assert losses_of(events[1]) == losses_of(events[0])
        # rank 0 writes the run's checkpoints and report; rank 1 writes neither
        assert not [e for e in events[1] if e["type"] in ("checkpoint", "finished")]
    checkpoints = [
        (e["step"], e["reason"]) for events in attempts for e in events[0] if e["type"] == "checkpoint"
    ]
    assert checkpoints == [(STOP_AT, "sigterm"), (CHECKPOINT_EVERY, "interval"), (STEPS, "final")]


def steps_of(events: list[dict[str, Any]]) -> list[int]:
    return [e["step"] for e in events if e["type"] == "progress"]


def losses_of(events: list[dict[str, Any]]) -> list[float]:
    return [e["loss"] for e in events if e["type"] == "progress"]


def test_stall_hook_stops_one_rank_while_the_other_waits_in_its_collective(
    data: dict[str, Path], tmp_path: Path
) -> None:
    gang = start_gang(section(data), tmp_path / "run", 1, env={STALL_ENV: "1:2"})
    try:
        pids = {}
        for rank in (0, 1):
            wait_for(gang, rank, lambda e: e["type"] == "progress" and e["step"] == 2, TIMEOUT)
            pids[rank] = next(e for e in gang.events()[rank] if e["type"] == "started")["pid"]
        logs = rank_logs(gang.attempt_dir)
        # a stack dump of each rank (SIGUSR1, faulthandler) shows where it is
        for rank, marker in ((0, "sum_counts"), (1, "stall_forever")):
            os.kill(pids[rank], signal.SIGUSR1)
            wait_for_text(logs[rank].stderr, marker, TIMEOUT)
        assert gang.child.poll() is None
        for rank in (0, 1):
            assert max(e["step"] for e in gang.events()[rank] if e["type"] == "progress") == 2
    finally:
        os.killpg(gang.child.pid, signal.SIGKILL)
    # torchrun's ranks live in sessions of their own; they die with it all the same
    deadline = time.monotonic() + TIMEOUT
    while any(process_alive(pid, None) for pid in pids.values()):
        assert time.monotonic() < deadline, f"ranks {pids} outlived torchrun"
        time.sleep(0.05)


def wait_for_text(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(encoding="utf-8", errors="replace"):
            return
        time.sleep(0.05)
    content = path.read_text(encoding="utf-8", errors="replace") if path.exists() else "(missing)"
    raise AssertionError(f"{text!r} not in {path}:\n{content[-3000:]}")
