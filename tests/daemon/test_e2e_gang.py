"""Multi-process runs through a real daemon: torchrun, two gloo ranks on the CPU, real failures.

- the shipped example: rank 1 runs out of memory for real under the address-space limit every
  rank gets; the daemon stops the gang, retunes every rank keeping the effective batch, resumes
  from the last checkpoint and ends on the weights of an uninterrupted run at the original
  micro-batch;
- the stall test hook stops rank 1's progress: the watchdog catches it within its bound, dumps
  every rank, records `hang` and restarts the gang from its checkpoint (`restart.on: [hang]`);
- `kill -9` of the daemon mid-gang: a new daemon re-adopts torchrun and every rank, reads every
  rank's events on from its own offset, and stops the whole gang;
- a rank killed by a signal while no daemon runs: the next daemon finds the gang ended, judges it
  by that rank (torchrun's exit status recorded for it, the ranks' files) and restarts it by the
  restart policy, as it would have watching;
- a two-rank run on a one-GPU spec is refused with one line.
Each gang costs a torch import per rank (seconds here); the in-process tests in
tests/supervise/test_gang.py cover the supervisor's decisions case by case.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from gpuwarden.runners.testing_models import build_example_assets, build_tiny_causal_lm, write_text_dataset
from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests.daemon.conftest import DaemonHandle, wait_for
from tests.runners.conftest import load_final_weights

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "examples" / "ddp-oom-recovery-cpu.yaml"
PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false"}


def _events(gw: DaemonHandle, run_id: str, type_: str) -> list[dict[str, Any]]:
    with gw.client() as client:
        page = client.events(run_id, since=0, limit=10_000)
    return [e.model_dump(mode="json") for e in page.events if e.type == type_]


def _detail(gw: DaemonHandle, ref: str) -> dict[str, Any]:
    """What `gpuwarden show REF --json` prints."""
    with gw.client() as client:
        return client.run(ref).model_dump(mode="json")


class _EventReader:
    """A run's events read on from where the last read ended, long-polling for new ones: a wait
    costs a request per batch of new events instead of a full read every 50 ms (ranks write an
    event a step, and re-reading all of them is what a waiting test would spend its CPU on)."""

    def __init__(self, gw: DaemonHandle, run_id: str) -> None:
        self._gw, self._run_id = gw, run_id
        self._since = 0
        self._seen: list[dict[str, Any]] = []

    def of(self, type_: str) -> list[dict[str, Any]]:
        """The events of `type_` read so far, after reading on (waiting up to a second)."""
        with self._gw.client() as client:
            page = client.events(self._run_id, since=self._since, limit=10_000, wait=1.0)
        self._since = page.next_since
        self._seen += [e.model_dump(mode="json") for e in page.events]
        return [e for e in self._seen if e["type"] == type_]


@pytest.fixture(scope="module")
def small_lm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("small-lm")
    return {
        "model": build_tiny_causal_lm(root / "lm", hidden=64, layers=1, vocab=512),
        "texts": write_text_dataset(root / "texts.jsonl", 200, seed=1),
    }


def _small_gang(name: str, assets: dict[str, Path], **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "kind": "train",
        "env": dict(PINNED),
        "resources": {"gpus": 0},
        "train": {
            "task": "causal_lm",
            "model": str(assets["model"]),
            "data": str(assets["texts"]),
            "max_length": 32,
            "batch_size": 2,
            "world_size": 2,
            "max_steps": 8,
            "log_interval": 1,
            "checkpoint_interval": 2,
            "collective_timeout": 600,  # the gloo timeout is not what ends a stalled gang here
            "seed": 0,
        },
    }
    for key, value in extra.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and key in spec else value
    return spec


@pytest.mark.slow
def test_the_example_recovers_a_ranks_oom_with_the_same_effective_batch_and_weights(
    gw: DaemonHandle, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "configs" / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, tree / "configs" / "examples")
    build_example_assets(tree / ".example-models")
    spec = tree / "configs" / "examples" / EXAMPLE.name
    # The reference runs alongside, uninterrupted and without a limit: one process whose two
    # accumulated micro-batches are the two ranks' (a gang trains what one process trains).
    reference = gw.write_spec(
        "reference",
        EXAMPLE.read_text()
        .replace("name: ddp-oom-recovery-cpu", "name: ddp-reference")
        .replace("memory_limit: 1.35GiB", "memory_limit: null")
        .replace("grad_accum_steps: 1\n", "grad_accum_steps: 2\n")
        .replace("world_size: 2 ", "world_size: 1 ")
        .replace("../../.example-models", str(tree / ".example-models")),
    )
    assert gw.cli("run", str(reference)).returncode == 0
    result = gw.cli("run", str(spec), "--follow", timeout=900)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-4000:]
    assert "gang_stopping" in shown and "retuned" in shown

    detail = _detail(gw, "ddp-oom-recovery-cpu")
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 16
    first, *_, last = detail["attempts"]
    assert first["classification"] == "oom" and first["reason"].startswith("rank 1: out of memory (host_oom)")
    assert last["classification"] == "succeeded" and last["world_size"] == 2
    ranks = {r["rank"]: r for r in first["ranks"]}
    assert ranks[1]["failure"] == "oom: host_oom" and ranks[0]["failure"] == "error: gang_aborted"
    assert all(r["vm_peak"] for r in last["ranks"]) and [r["step"] for r in last["ranks"]] == [6, 6]
    retune = detail["retunes"][0]
    assert retune["verdict"] == "host_oom"
    assert retune["from"] == {"train.batch_size": 8, "train.grad_accum_steps": 1}
    assert retune["to"]["train.batch_size"] * retune["to"]["train.grad_accum_steps"] == 8
    (stopping, *_) = _events(gw, detail["id"], "gang_stopping")
    assert (stopping["cause"], stopping["rank"]) == ("oom", 1)
    started = [e for e in _events(gw, detail["id"], "started") if e["attempt"] == last["attempt"]]
    assert {e["rank"] for e in started} == {0, 1}
    assert all(e["resumed_from"].endswith("00000003") for e in started)  # the last complete one

    ref = gw.wait_state(_detail(gw, "ddp-reference")["id"], timeout=600)
    assert ref["state"] == "succeeded", ref["message"]
    assert [a["world_size"] for a in _detail(gw, "ddp-reference")["attempts"]] == [1]
    recovered = load_final_weights(Path(detail["run_dir"]))
    expected = load_final_weights(Path(ref["run_dir"]))
    assert recovered.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_a_stalled_rank_is_caught_within_the_bound_dumped_and_the_gang_restarted(
    gw: DaemonHandle, small_lm: dict[str, Path]
) -> None:
    watch = {"factor": 10, "min_seconds": 5, "warmup_steps": 1}
    spec = _small_gang(
        "stall",
        small_lm,
        env={STALL_ENV: "1:3"},  # rank 1 sleeps once it has done step 3
        policy={"base": "default", "hang": watch},
        restart={"on": ["hang"], "max": 1, "backoff": 0},
    )
    run = gw.submit(spec)
    events = _EventReader(gw, run["id"])
    (hang,) = wait_for(lambda: events.of("hang"), "the watchdog's hang event", timeout=300)
    # K × the median step, at least the floor; caught after the bound, long before the collective
    # timeout would have ended it
    assert hang["bound_s"] == max(5.0, 10 * hang["median_step_s"])
    assert hang["bound_s"] <= hang["quiet_s"] < hang["bound_s"] + 60
    assert hang["last_steps"] == {"0": 3, "1": 3} and hang["suspects"] == [1]
    assert "stall_forever" in hang["stacks"]["1"]["text"] and hang["stacks"]["1"]["how"] in (
        "SIGUSR1",
        "py-spy",
    )
    assert "torch/distributed" in hang["stacks"]["0"]["text"]
    assert "stall_forever" in Path(hang["dump"]).read_text()
    (restart,) = wait_for(lambda: events.of("restart"), "the restart", timeout=120)
    assert restart["cause"] == "hang"
    resumed = wait_for(
        lambda: [e for e in events.of("started") if e["attempt"] == 2],
        "the restarted gang's ranks",
        timeout=300,
    )
    assert all(e["resumed_from"].endswith("00000002") for e in resumed)  # the last checkpoint
    detail = _detail(gw, run["id"])
    assert detail["attempts"][0]["classification"] == "hang"
    assert [r["straggler"] for r in detail["attempts"][0]["ranks"]] == [False, True]
    shown = gw.cli("show", run["id"]).stdout
    assert (
        "attempt 1: hang" in shown
        and "rank 1  pid" in shown
        and "← straggler (outside any collective" in shown
    )
    stopped = gw.cli("stop", run["id"], timeout=120)
    assert stopped.returncode == 0, stopped.stderr


@pytest.mark.slow
def test_kill9_of_the_daemon_mid_gang_readopts_torchrun_and_every_rank(
    daemon_factory: Any, small_lm: dict[str, Path]
) -> None:
    gw: DaemonHandle = daemon_factory()
    # rank 1 stops progressing after step 4: the gang stays alive for the test to end it
    spec = _small_gang(
        "adopt", small_lm, env={STALL_ENV: "1:4"}, policy={"base": "default", "hang": {"min_seconds": 600}}
    )
    run = gw.submit(spec)
    events = _EventReader(gw, run["id"])
    wait_for(
        lambda: {e["rank"] for e in events.of("progress") if e["step"] >= 1} == {0, 1},
        "both ranks' first step",
        timeout=300,
    )
    attempt = _detail(gw, run["id"])["attempts"][0]
    recorder, torchrun = attempt["pid"], attempt["program_pid"]  # the exit recorder started torchrun
    gw.kill9()
    assert psutil.pid_exists(recorder) and psutil.pid_exists(torchrun)  # the gang outlives its daemon
    gw.start()
    detail = wait_for(
        lambda: (d := _detail(gw, run["id"]))["attempts"][0]["adopted"] and d,
        "the adoption",
        timeout=60,
    )
    assert detail["state"] == "running" and detail["attempts"][0]["pid"] == recorder
    assert detail["attempts"][0]["program_pid"] == torchrun
    wait_for(
        lambda: {e["rank"] for e in events.of("progress") if e["step"] == 4} == {0, 1},
        "both ranks' step 4",
        timeout=300,
    )
    ranks = wait_for(
        lambda: [r for r in _detail(gw, run["id"])["attempts"][0]["ranks"] if r["step"] == 4],
        "both ranks at step 4",
    )
    assert len(ranks) == 2
    rank_pids = [r["pid"] for r in ranks]
    assert all(psutil.pid_exists(pid) for pid in rank_pids)
    for rank in (0, 1):  # every event of every rank stored exactly once across the two daemons
        steps = [e["step"] for e in _events(gw, run["id"], "progress") if e["rank"] == rank]
        assert steps == [1, 2, 3, 4], steps
    stopped = gw.cli("stop", run["id"], timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    gone = [recorder, torchrun, *rank_pids]
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in gone),
             "torchrun and both ranks gone")  # fmt: skip


@pytest.mark.slow
def test_a_rank_killed_while_no_daemon_ran_restarts_the_gang_by_the_policy(
    daemon_factory: Any, small_lm: dict[str, Path]
) -> None:
    gw: DaemonHandle = daemon_factory()
    # rank 1 stops progressing after step 2's checkpoint: the gang waits for the test's kill
    spec = _small_gang(
        "segv",
        small_lm,
        env={STALL_ENV: "1:2"},
        policy={"base": "default", "hang": {"min_seconds": 600}},
        restart={"on": ["signal"], "max": 1, "backoff": 0},
    )
    run = gw.submit(spec)
    events = _EventReader(gw, run["id"])
    wait_for(lambda: events.of("checkpoint"), "the checkpoint of step 2", timeout=300)
    (rank1,) = wait_for(
        lambda: [e["pid"] for e in events.of("started") if e["rank"] == 1], "rank 1's pid", timeout=60
    )
    recorder = _detail(gw, run["id"])["attempts"][0]["pid"]
    gw.kill9()
    resource.prlimit(rank1, resource.RLIMIT_CORE, (0, 0))  # no core file of a torch process
    os.kill(rank1, signal.SIGSEGV)
    # torchrun ends the gang, then its recorder writes torchrun's exit status and ends
    wait_for(lambda: not _alive(recorder), "the gang to end while no daemon runs", timeout=120)
    gw.start()

    done = gw.wait_state(run["id"], timeout=600)
    assert done["state"] == "succeeded", done["message"]
    first, second = done["attempts"]
    assert second["classification"] == "succeeded" and second["world_size"] == 2
    assert first["classification"] == "failed"
    assert first["reason"] == "rank 1: failed (killed by SIGSEGV); ended while the daemon was down"
    assert first["restart"] == {"cause": "killed by SIGSEGV", "restart": 1, "max": 1, "backoff_s": 0}
    resumed = [e for e in _events(gw, run["id"], "started") if e["attempt"] == 2]
    assert {e["rank"] for e in resumed} == {0, 1}
    assert all(e["resumed_from"].endswith("00000002") for e in resumed)  # the last checkpoint
    shown = gw.cli("show", run["id"]).stdout
    assert "restart 1 of 1 after 0 s: killed by SIGSEGV" in shown, shown


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_two_rank_run_on_a_one_gpu_spec_is_refused_with_one_line(gw: DaemonHandle, tmp_path: Path) -> None:
    spec = gw.write_spec(
        "two-on-one",
        """
        name: two-on-one
        kind: train
        resources: {gpus: 1}
        train: {task: image, world_size: 2}
        """,
    )
    result = gw.cli("run", str(spec))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "world_size 2" in lines[0] and "resources.gpus: 2" in lines[0]


def test_a_run_over_several_machines_is_sent_to_a_cluster_job(gw: DaemonHandle) -> None:
    spec = gw.write_spec(
        "two-machines",
        """
        name: two-machines
        kind: train
        resources: {gpus: 0, nodes: 2}
        train: {task: image, world_size: 2}
        """,
    )
    result = gw.cli("run", str(spec))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "resources.nodes is 2" in line and "gpuwarden exec --nodes 2" in line
