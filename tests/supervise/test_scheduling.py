"""Placement: runs wait in the queue for GPUs, oldest first, none blocking the ones behind it."""

from __future__ import annotations

import signal

from gpuwarden.core.run_state import RunState
from tests.supervise.conftest import Rig, command


def test_a_third_run_waits_for_a_gpu_and_takes_the_one_freed(rig: Rig) -> None:
    a, b, c = (rig.submit(command(name)) for name in "abc")
    rig.step()
    gpus = {run_id: rig.proc_of(run_id).env["CUDA_VISIBLE_DEVICES"] for run_id in (a, b)}
    assert sorted(gpus.values()) == ["GPU-0", "GPU-1"]
    rig.step(5)
    assert rig.state(c) == RunState.QUEUED and len(rig.procs.spawned) == 2
    rig.proc_of(b).exit(0)
    rig.step(2)
    assert rig.state(c) == RunState.RUNNING
    assert rig.proc_of(c).env["CUDA_VISIBLE_DEVICES"] == gpus[b]


def test_a_run_that_cannot_fit_does_not_block_the_ones_behind_it(rig: Rig) -> None:
    big = rig.submit(command("big", resources={"gpus": 1, "min_free_memory": "100GiB"}))
    small = rig.submit(command("small"))
    rig.step()
    assert rig.state(big) == RunState.QUEUED and rig.state(small) == RunState.RUNNING


def test_named_gpus_and_cpu_runs(rig: Rig) -> None:
    named = rig.submit(command("named", resources={"gpus": ["1"]}))
    cpu = rig.submit(command("cpu", resources={"gpus": 0}))
    rig.step()
    assert rig.proc_of(named).env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert rig.proc_of(cpu).env["CUDA_VISIBLE_DEVICES"] == ""


def test_more_runs_per_gpu_when_the_settings_allow(rig: Rig) -> None:
    rig.settings = rig.settings.model_copy(update={"max_runs_per_gpu": 2})
    rig.gpus = rig.gpus[:1]
    rig.use(rig.hooks)
    runs = [rig.submit(command(f"r{i}")) for i in range(3)]
    rig.step()
    assert [rig.state(r) for r in runs] == [RunState.RUNNING, RunState.RUNNING, RunState.QUEUED]


def test_without_gpus_a_run_that_allows_it_goes_to_the_cpu_with_a_warning(rig: Rig) -> None:
    rig.gpus = []
    run_id = rig.submit(command())
    rig.step()
    assert rig.proc_of(run_id).env["CUDA_VISIBLE_DEVICES"] == ""
    (warning,) = rig.events(run_id, "warning")
    assert warning["code"] == "cpu_fallback"
    # It names what the user can write, not a default they never did (`allow_cpu: true`).
    assert "allow_cpu: true" not in warning["message"] and "resources.allow_cpu: false" in warning["message"]


def test_a_run_is_told_once_that_it_runs_on_the_cpu_not_at_every_attempt(rig: Rig) -> None:
    rig.gpus = []
    run_id = rig.submit(command(restart={"on": ["signal"], "max": 2, "backoff": 0}))
    rig.step()
    for _ in range(2):
        rig.proc_of(run_id).exit(sig=signal.SIGKILL)
        rig.step()
    assert rig.run(run_id)["attempt"] == 3 and rig.state(run_id) == RunState.RUNNING
    assert [w["attempt"] for w in rig.events(run_id, "warning")] == [1]
    # It names the flag a run submitted from the command line asks for the CPU with.
    assert "--gpus 0" in rig.events(run_id, "warning")[0]["message"]


def test_memory_limit_reaches_the_process_layer(rig: Rig) -> None:
    run_id = rig.submit(command(resources={"gpus": 1, "memory_limit": "3GiB"}))
    rig.step()
    assert rig.proc_of(run_id).memory_limit == 3 << 30


def test_a_waiting_run_says_what_it_waits_for(rig: Rig) -> None:
    a = rig.submit(command("a"))
    rig.step()
    pair = rig.submit(command("pair", resources={"gpus": 2}))
    big = rig.submit(command("big", resources={"gpus": 1, "min_free_memory": "100GiB"}))
    named = rig.submit(command("named", resources={"gpus": ["0", "1"]}))
    rig.step(2)
    assert rig.run(pair)["message"] == "waiting for 2 GPUs: 1 free now"
    assert rig.run(big)["message"] == "waiting for 1 GPU with 100.0 GiB free: 0 free now"
    taken = rig.proc_of(a).env["CUDA_VISIBLE_DEVICES"].removeprefix("GPU-")
    assert rig.run(named)["message"] == (
        f"waiting for GPU {taken} (another run has it, or its memory is in use)"
    )
    said = [d["message"] for kind, d in rig.broadcaster.frames if kind == "run" and d["id"] == pair]
    rig.step(3)
    again = [d["message"] for kind, d in rig.broadcaster.frames if kind == "run" and d["id"] == pair]
    assert again == said and said.count("waiting for 2 GPUs: 1 free now") == 1  # once, not every pass
    rig.proc_of(a).exit(0)
    rig.step(2)
    assert rig.state(pair) == RunState.RUNNING
