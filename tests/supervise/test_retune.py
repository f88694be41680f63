"""Out of memory → the retune hook → the next attempt with the hook's spec (or the run fails)."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuwarden.core.events import EXIT_OOM
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import AttemptEnd, Hooks, NextAttempt, RetuneGiveUp, RetuneNotes
from tests.supervise.conftest import GIB, HOST_MEMORY, Rig, command

CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


class Halving:
    """A retune policy that halves the `bs` knob, and keeps what it was given; `said`: the notes
    it makes while it decides (as its probes do)."""

    def __init__(self, said: Sequence[str] = ()) -> None:
        self.calls: list[tuple[AttemptEnd, list[str]]] = []
        self.said = said

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes,
    ) -> NextAttempt | None:
        self.calls.append((end, [e["type"] for e in events if e["attempt"] == end.number]))
        for message in self.said:
            notes("probe", message=message)
        spec = dict(run["spec"])
        old = spec["knobs"]["bs"]
        spec["knobs"] = {**spec["knobs"], "bs": old // 2}
        return NextAttempt(spec=spec, from_={"bs": old}, to={"bs": old // 2}, verdict="gpu_capacity")


def _oom(rig: Rig, run_id: str) -> None:
    proc = rig.proc_of(run_id)
    proc.emit("oom", verdict="gpu_capacity", message="CUDA out of memory")
    proc.exit(EXIT_OOM)


def test_oom_is_retuned_until_the_run_fits(rig: Rig) -> None:
    hook = Halving()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(command(knobs={"bs": 16}, resources={"gpus": 1, "memory_limit": "8GiB"}))
    rig.step()
    for _ in range(2):
        _oom(rig, run_id)
        rig.step()  # ends the attempt; the hook decides (inline here)
        assert rig.state(run_id) == RunState.RETUNING
        rig.step()  # the loop applies the decision: the next attempt starts
    assert rig.state(run_id) == RunState.RUNNING
    rig.proc_of(run_id).exit(0)
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.SUCCEEDED and run["attempt"] == 3 and run["spec"]["knobs"]["bs"] == 4
    ends = [end for end, _ in hook.calls]
    assert [(e.number, e.outcome, e.exit_code) for e in ends] == [(1, "oom", EXIT_OOM), (2, "oom", EXIT_OOM)]
    assert all(
        e.gpus == ["GPU-0"] and e.gpu_capacity == 80 * GIB and e.host_capacity == 8 * GIB for e in ends
    )
    assert all("oom" in types for _, types in hook.calls)
    retunes = [(r["from"], r["to"], r["outcome"]) for r in rig.retunes(run_id)]
    assert retunes == [({"bs": 16}, {"bs": 8}, "oom"), ({"bs": 8}, {"bs": 4}, "succeeded")]
    assert rig.states(run_id).count("retuning") == 2
    assert rig.states(run_id)[-3:] == ["starting", "running", "succeeded"]
    assert [e["changes"] for e in rig.events(run_id, "retuned")] == [{"bs": 8}, {"bs": 4}]
    assert rig.workers.names == [f"retune-{run_id}"] * 2


def test_what_the_policy_says_while_it_decides_is_recorded_on_the_failed_attempt(rig: Rig) -> None:
    rig.use(Hooks(retune=Halving(said=["probe 1 of 2: micro-batch 4 starting", "probe 1 of 2: fits"])))
    rig.workers.hold = True  # the policy decides on its own thread, while the loop goes on
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    rig.workers.release()
    notes = rig.events(run_id, "probe")
    assert [(e["message"], e["attempt"], e["source"]) for e in notes] == [
        ("probe 1 of 2: micro-batch 4 starting", 1, "daemon"),
        ("probe 1 of 2: fits", 1, "daemon"),
    ]
    assert rig.state(run_id) == RunState.RETUNING, "said before the decision is applied"
    rig.step()
    kinds = [e["type"] for e in rig.events(run_id) if e["type"] in ("state", "probe", "retuned")]
    assert kinds[-6:] == ["state", "probe", "probe", "retuned", "state", "state"]


def test_a_command_oom_is_read_from_stderr(rig: Rig) -> None:
    hook = Halving()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    rig.proc_of(run_id).write_stderr(CUDA_OOM)
    rig.proc_of(run_id).exit(1)
    rig.step(2)
    ((end, _),) = hook.calls
    assert end.exit_code == 1 and "CUDA out of memory" in end.stderr_tail
    assert end.host_capacity == HOST_MEMORY  # no memory_limit: the host's memory
    assert rig.state(run_id) == RunState.RUNNING and rig.run(run_id)["attempt"] == 2


CPU_OOM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
    "memory: you tried to allocate 134217728 bytes. Error code 12 (Cannot allocate memory)\n"
)


def test_a_host_oom_under_the_runs_memory_limit_names_the_limit_not_the_hosts_memory(rig: Rig) -> None:
    rig.use(Hooks(retune=Halving()))
    limited = rig.submit(
        command("limited", knobs={"bs": 16}, resources={"gpus": 0, "memory_limit": "1300MiB"})
    )
    free = rig.submit(command("free", knobs={"bs": 16}, resources={"gpus": 0}))
    rig.step()
    for run_id in (limited, free):
        rig.proc_of(run_id).write_stderr(CPU_OOM)
        rig.proc_of(run_id).exit(1)
    rig.step(2)
    first_limited, first_free = rig.attempts(limited)[0], rig.attempts(free)[0]
    assert first_limited["reason"] == (
        "host_oom: host allocator could not allocate 128.00 MiB: the run's memory limit (1.27 GiB of address space) reached"
        " (exit code 1)"
    )
    assert first_free["reason"].endswith("could not allocate 128.00 MiB: host memory exhausted (exit code 1)")


def test_a_kernel_oom_kill_is_an_oom(rig: Rig) -> None:
    hook = Halving()
    rig.use(Hooks(retune=hook))
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    rig.oom_kills = 1  # the cgroup's counter grew while the attempt ran
    rig.proc_of(run_id).exit(sig=signal.SIGKILL)
    rig.step()
    ((end, _),) = hook.calls
    assert end.oom_kill is True and end.signal == signal.SIGKILL
    assert "OOM killer" in end.reason


def test_without_a_retune_policy_the_oom_run_fails(rig: Rig) -> None:
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step(2)
    run = rig.run(run_id)
    assert run["state"] == RunState.FAILED and "out of memory" in run["message"]
    assert rig.retunes(run_id) == []


def test_a_policy_that_gives_up_fails_the_run_with_its_reason(rig: Rig) -> None:
    def give_up(
        run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]], notes: RetuneNotes
    ) -> None:
        raise RetuneGiveUp("batch size 1 still does not fit")

    rig.use(Hooks(retune=give_up))
    run_id = rig.submit(command(knobs={"bs": 1}))
    rig.step()
    _oom(rig, run_id)
    rig.step(2)
    assert rig.run(run_id)["message"].endswith("; batch size 1 still does not fit")
    assert rig.state(run_id) == RunState.FAILED


def test_a_policy_that_crashes_fails_the_run_in_one_line(rig: Rig) -> None:
    def broken(
        run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]], notes: RetuneNotes
    ) -> None:
        raise KeyError("train")

    rig.use(Hooks(retune=broken))
    run_id = rig.submit(command(knobs={"bs": 4}))
    rig.step()
    _oom(rig, run_id)
    rig.step(2)
    assert rig.run(run_id)["message"].endswith("; retune failed: 'train'")


def test_a_run_stopped_while_the_policy_thinks_stays_stopped(rig: Rig) -> None:
    rig.use(Hooks(retune=Halving()))
    rig.workers.hold = True  # the policy is still probing
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    assert rig.state(run_id) == RunState.RETUNING
    probe = rig.procs.start_probe(run_id, rig.paths.state_dir / "probe")
    rig.sup.stop_run(run_id)
    assert rig.state(run_id) == RunState.STOPPED
    assert not probe.running  # the probe does not outlive the stop (it would hold the GPU)
    rig.workers.release()
    rig.step()
    assert rig.state(run_id) == RunState.STOPPED
    assert rig.run(run_id)["attempt"] == 1 and rig.retunes(run_id) == []


def test_a_retuning_run_keeps_its_gpu_until_the_decision(rig: Rig) -> None:
    rig.gpus = rig.gpus[:1]
    rig.use(Hooks(retune=Halving()))
    rig.workers.hold = True
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    other = rig.submit(command("other"))
    rig.step(3)
    assert rig.state(other) == RunState.QUEUED  # the GPU is the retuning run's
    rig.workers.release()
    rig.step()
    assert rig.state(run_id) == RunState.RUNNING and rig.state(other) == RunState.QUEUED
    rig.proc_of(run_id).exit(0)
    rig.step(2)
    assert rig.state(other) == RunState.RUNNING


def test_a_decision_that_does_not_fit_now_waits_in_the_queue(rig: Rig) -> None:
    rig.gpus = rig.gpus[:1]
    rig.use(Hooks(retune=Halving()))
    rig.workers.hold = True
    run_id = rig.submit(command(knobs={"bs": 16}))
    rig.step()
    _oom(rig, run_id)
    rig.step()
    rig.gpus = [replace(rig.gpus[0], lost=True)]  # the GPU fell off the bus while the policy thought
    rig.workers.release()
    rig.step()
    run = rig.run(run_id)
    assert run["state"] == RunState.QUEUED and run["message"] == "retuned (bs: 16 → 8); waiting for GPUs"
