"""Two-rank training gangs on the CPU (gloo), started by torchrun as the daemon will start them.

The data is shaped so that one rank alone meets a large shape: every text is a few words except
the eight samples rank 1 trains on in step 4, which fill `max_length` (a 32000-word vocabulary
makes their logits cost ~0.6 GB more). Under an address-space limit on every process that only
rank 1 exceeds, and only at micro-batch 8, rank 1 runs out of memory for real.

(a) an uninterrupted run is the reference. A second run lives through three attempts, as a run
the daemon stops, restarts and retunes would: (b) SIGTERM to torchrun's process group stops every
rank after the same step; (c) the next attempt, under the limit, resumes from that checkpoint and
rank 1 runs out of memory: its `oom` event, exit 3, the gang torn down; (d) the third resumes at
a quarter of the micro-batch and four times the accumulation (same effective batch) and ends on
the reference's weights, which it can only do if both checkpoints it went through were exact.
(e) the stall hook stops rank 1 while rank 0 waits in its collective, and SIGKILL to torchrun
takes both ranks with it.
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
from tests.runners.conftest import load_final_weights
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
def reference(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Gang:
    gang = start_gang(section(data), tmp_path_factory.mktemp("reference") / "run", 1)
    status = gang.wait(TIMEOUT)
    assert status.code == EXIT_OK, gang.stderr()[-3000:]
    return gang


def test_uninterrupted_gang_trains_every_sample_once_and_reports_each_rank(reference: Gang) -> None:
    events = reference.events()
    assert sorted(events) == [0, 1]
    for rank, rank_events in events.items():
        assert all(e["rank"] == rank for e in rank_events)
        progress = [e for e in rank_events if e["type"] == "progress"]
        assert [p["step"] for p in progress] == list(range(1, STEPS + 1))
        assert progress[-1]["samples_seen"] == STEPS * MICRO * WORLD  # the gang's samples
        assert all(p["vm_peak"] for p in progress)  # every rank reports its own memory
        started = next(e for e in rank_events if e["type"] == "started")
        assert started["world_size"] == WORLD and started["pid"] > 0
    # the ranks agree on the loss; only rank 1 met the long samples, and its memory says so
    assert [p["loss"] for p in events[0] if p["type"] == "progress"] == [
        p["loss"] for p in events[1] if p["type"] == "progress"
    ]
    peak = {r: max(e["vm_peak"] for e in ev if e["type"] == "progress") for r, ev in events.items()}
    assert peak[1] > peak[0] + 200 * 2**20, peak
    # rank 0 writes the run's checkpoints and report; rank 1 writes neither
    assert [e["step"] for e in events[0] if e["type"] == "checkpoint"] == [CHECKPOINT_EVERY, STEPS]
    assert not [e for e in events[1] if e["type"] in ("checkpoint", "finished")]
    report = next(e for e in events[0] if e["type"] == "finished")["report"]
    assert report["world_size"] == WORLD and report["effective_batch"] == MICRO * WORLD
    outcome = read_gang_outcome(reference.attempt_dir, WORLD, reference.stderr())
    assert outcome.first_failure is None
    assert [r.last_event for r in outcome.ranks] == ["finished", "progress"]


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


def test_resume_after_the_oom_with_a_quarter_micro_batch_matches_the_reference(
    data: dict[str, Path], oom_run: Gang, reference: Gang
) -> None:
    run_dir = oom_run.attempt_dir.parents[1]
    resumed = start_gang(section(data, MICRO // 4, 4), run_dir, 3, limit=LIMIT)
    assert resumed.wait(TIMEOUT).code == EXIT_OK, resumed.stderr()[-3000:]
    events = resumed.events()
    started = next(e for e in events[0] if e["type"] == "started")
    assert started["resumed_from"].endswith(f"{CHECKPOINT_EVERY:08d}")
    assert not [e for e in events[0] if e["type"] == "warning"], events[0]  # same effective batch
    report = next(e for e in events[0] if e["type"] == "finished")["report"]
    assert report["batch_size"] == MICRO // 4 and report["effective_batch"] == MICRO * WORLD
    assert_same_weights(run_dir, reference.attempt_dir.parents[1])


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
