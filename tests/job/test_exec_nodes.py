"""A run over two machines, as a two-node cluster job runs it: two `gpuwarden exec` processes
(node ranks 0 and 1) on one host, one run folder, torchrun's c10d rendezvous on 127.0.0.1.

The shipped two-rank example puts rank 0 on node 0 and rank 1 on node 1; rank 1 runs out of
memory for real under the address-space limit. Node 0 stops both machines' ranks, decides one
retune, both machines resume from the last complete checkpoint, and the weights end where an
uninterrupted run at the original micro-batch ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.client.run_folders import RunFolders
from gpuwarden.core.gang.nodes import LeaderBeat, node_exit_path, read_beat
from gpuwarden.job import exit_codes
from gpuwarden.runners.testing_models import build_example_assets
from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests import preloaded
from tests.daemon.conftest import REPO, DaemonHandle, wait_for
from tests.job.test_exec import Job
from tests.runners.conftest import load_final_weights

EXAMPLE = REPO / "configs" / "examples" / "ddp-oom-recovery-cpu.yaml"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false"}
# The bound: the first failing rank on any machine stops every machine's ranks within it.
STOP_BOUND_S = 5.0


@pytest.fixture
def job(daemon_factory: Any) -> Iterator[Job]:
    handle: DaemonHandle = daemon_factory(start=False)
    started = Job(handle.root, handle.env)
    yield started
    started.stop_all()


def _node(
    job: Job, spec: Path, folder: Path, rank: int, env: dict[str, str] | None = None
) -> preloaded.Captured:
    args = [str(spec), "--run", str(folder), "--nodes", "2", "--node-rank", str(rank)]
    if rank == 0:
        args += ["--rendezvous-host", "127.0.0.1"]
    return job.start(*args, env=env)


def _events(folder: Path, kind: str) -> list[dict[str, Any]]:
    """The run's events of `kind` (none before node 0's exec has recorded the run)."""
    if not (folder / "run.db").exists():
        return []
    reader = RunFolders.one(folder)
    runs = reader.runs()
    if not runs:
        return []
    return [e.model_dump() for e in reader.events(runs[0].id, limit=10_000).events if e.type == kind]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_ranks_oom_on_one_machine_stops_both_retunes_once_and_both_resume(job: Job, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "configs" / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, tree / "configs" / "examples")
    build_example_assets(tree / ".example-models")
    spec = tree / "configs" / "examples" / EXAMPLE.name
    folder = tmp_path / "shared" / "run"
    # Node 1 first: a follower waits for its leader, whichever machine's step starts first.
    follower = _node(job, spec, folder, 1)
    leader = _node(job, spec, folder, 0)
    out0, err0 = leader.communicate(timeout=800)
    _, err1 = follower.communicate(timeout=120)
    assert leader.returncode == exit_codes.SUCCEEDED, (out0 + err0)[-4000:]
    assert follower.returncode == exit_codes.SUCCEEDED, err1[-2000:]
    assert "node 1: attempt 1 started (rank 1" in err1 and "node 1: attempt 2 started (rank 1" in err1

    shown = job.cli("show", "--runs", str(folder.parent), "ddp-oom-recovery-cpu", "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 16
    first, last = detail["attempts"]
    assert first["classification"] == "oom" and first["reason"].startswith("rank 1: out of memory (host_oom)")
    assert last["classification"] == "succeeded" and last["world_size"] == 2
    (retune,) = detail["retunes"]
    assert retune["from"] == {"train.batch_size": 8, "train.grad_accum_steps": 1}
    assert retune["to"]["train.batch_size"] * retune["to"]["train.grad_accum_steps"] == 8
    (stopping,) = _events(folder, "gang_stopping")
    assert (stopping["cause"], stopping["rank"]) == ("oom", 1)
    started = [e for e in _events(folder, "started") if e["attempt"] == 2]
    assert {e["rank"] for e in started} == {0, 1}
    assert all(e["resumed_from"].endswith("00000003") for e in started)  # the last complete one

    # Both machines' ranks stopped within the bound of rank 1's failure: attempt 1 ends when node
    # 0 has seen every machine's torchrun end (node 1's recorded as its file).
    (oom,) = [e for e in _events(folder, "oom") if e["attempt"] == 1]
    assert node_exit_path(folder / "attempts" / "1", 1).is_file()
    assert first["ended_at"] - float(oom["ts"]) < STOP_BOUND_S

    reference = _reference(tree, tmp_path)
    recovered = load_final_weights(folder)
    assert recovered.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def _reference(tree: Path, tmp_path: Path) -> dict[str, Any]:
    """The uninterrupted run: one process whose two accumulated micro-batches are the two ranks'
    (a gang trains what one process trains), with no limit."""
    text = (
        EXAMPLE.read_text()
        .replace("memory_limit: 1.35GiB", "memory_limit: null")
        .replace("grad_accum_steps: 1\n", "grad_accum_steps: 2\n")
        .replace("world_size: 2 ", "world_size: 1 ")
        .replace("../../.example-models", str(tree / ".example-models"))
    )
    spec = tmp_path / "reference.yaml"
    spec.write_text(text)
    run_dir = tmp_path / "reference-run"
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.runners", "--spec", str(spec), "--run-dir", str(run_dir)],
        env={**os.environ, **PINNED},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return load_final_weights(run_dir)


@pytest.mark.slow
def test_a_run_over_machines_is_asked_for_plainly(job: Job, tmp_path: Path) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(EXAMPLE.read_text().replace("world_size: 2 ", "world_size: 3 "))
    for args, words in (
        ((str(EXAMPLE), "--nodes", "2"), "give --run DIR"),
        ((str(EXAMPLE), "--run", str(tmp_path / "r"), "--nodes", "2", "--node-rank", "2"), "ranked 0 … 1"),
        ((str(EXAMPLE), "--node-rank", "1"), "needs --nodes"),
        ((str(EXAMPLE), "--run", str(tmp_path / "r"), "--nodes", "2"), "--node-rank"),
        ((str(spec), "--run", str(tmp_path / "r"), "--nodes", "2", "--node-rank", "0"), "does not share out"),
    ):
        done = job.run(*args, timeout=60)
        assert done.returncode == exit_codes.REFUSED, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and words in done.stderr, (args, done.stderr)


# Two CPU ranks, one per machine: rank 0 holds after step 10 (its checkpoint) until it is killed;
# resumed from that checkpoint, it goes on.
HELD_PAIR = f"""
name: held-pair
kind: train
env: {{OMP_NUM_THREADS: "1", {STALL_ENV}: "0:10"}}
resources: {{gpus: 0, nodes: 2}}
train:
  task: image
  world_size: 2
  batch_size: 4
  max_steps: 20
  log_interval: 5
  checkpoint_interval: 10
  image: {{base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 64}}
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_node_0_killed_and_started_again_takes_over_and_a_stop_reaches_every_machine(
    job: Job, tmp_path: Path
) -> None:
    spec = job.spec("held-pair", HELD_PAIR)
    folder = tmp_path / "shared" / "run"
    follower = _node(job, spec, folder, 1)
    first = _node(job, spec, folder, 0)
    wait_for(lambda: _events(folder, "checkpoint"), "step 10's checkpoint")
    first.kill()  # SIGKILL: the exec only; both machines' ranks run on in their own sessions
    first.communicate(timeout=60)
    before = read_beat(folder)
    again = _node(job, spec, folder, 0)
    # Node 1 follows a new node 0 once its heartbeat rises (it polls ten times a second).
    wait_for(lambda: _risen(folder, before), "the new exec's heartbeat", timeout=60)
    # A preemption: every machine's ranks are stopped (rank 0, held, only by the SIGKILL after the
    # grace period), and both execs end with "start me again".
    again.send_signal(signal.SIGTERM)
    out, err = again.communicate(timeout=180)
    _, follower_err = follower.communicate(timeout=120)
    assert again.returncode == exit_codes.RESTART, (out + err)[-3000:]
    assert follower.returncode == exit_codes.RESTART, follower_err[-2000:]
    assert "node 0's gpuwarden exec started again: following it" in follower_err
    (attempt,) = _attempts(job, folder)
    assert attempt["classification"] == "stopped" and attempt["world_size"] == 2

    # The same two commands again, as the engine would: attempt 2 goes on from step 10.
    follower = _node(job, spec, folder, 1)
    last = _node(job, spec, folder, 0)
    out, err = last.communicate(timeout=300)
    follower.communicate(timeout=120)
    assert last.returncode == exit_codes.SUCCEEDED and follower.returncode == exit_codes.SUCCEEDED, err[
        -3000:
    ]
    steps = {(e["attempt"], e["rank"]): e["step"] for e in _events(folder, "progress")}
    assert max(s for (a, _), s in steps.items() if a == 1) == 10 and steps[(2, 0)] == steps[(2, 1)] == 20
    started = [e for e in _events(folder, "started") if e["attempt"] == 2]
    assert {e["rank"] for e in started} == {0, 1} and all(
        e["resumed_from"].endswith("00000010") for e in started
    )


def _risen(folder: Path, before: LeaderBeat | None) -> bool:
    beat = read_beat(folder)
    return beat is not None and before is not None and beat.token != before.token and beat.beat >= 3


def _attempts(job: Job, folder: Path) -> list[dict[str, Any]]:
    shown = job.cli("show", "--runs", str(folder.parent), "held-pair", "--json")
    assert shown.returncode == 0, shown.stderr
    attempts: list[dict[str, Any]] = json.loads(shown.stdout)["attempts"]
    return attempts
