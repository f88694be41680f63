"""The daemon's OOM hook when other processes hold the memory: wait (bounded), then move GPU —
never shrink the run (the classic "25.84 GiB allocated on a 12 GB card?")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.telemetry.types import GpuProcess
from gpuwarden.core.tune.memory_points import MemoryPoints, memory_key
from gpuwarden.daemon.oom_retune import OomRetune, rank_events
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.supervise import AttemptEnd, RetuneGiveUp

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
CONTENTION = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 512.00 MiB is free. Process 4242 has 70.00 GiB memory in use. Including non-PyTorch "
    "memory, this process has 8.50 GiB memory in use."
)
RUN: dict[str, Any] = {
    "id": "r1",
    "run_dir": "/nonexistent",
    "spec": {
        "name": "cmd",
        "kind": "command",
        "command": {"argv": ["python", "train.py", "--batch", "{batch_size}"]},
        "knobs": {"batch_size": 32},
        "resources": {"gpus": ["GPU-a"]},
    },
}


def _end() -> AttemptEnd:
    return AttemptEnd(
        number=1, outcome="oom", reason="oom", exit_code=1, signal=None, oom_kill=None,
        stderr_tail=CONTENTION, gpus=["GPU-a"], gpu_capacity=80 * GIB, host_capacity=None, adopted=False, pid=None,
    )  # fmt: skip


def _hook(retunes: list[dict[str, Any]], slept: list[float], gpus: list[GpuState]) -> OomRetune:
    return OomRetune(
        gpu_states=lambda: gpus,
        gpu_processes=lambda: [GpuProcess(ts=0, uuid="GPU-a", pid=4242, used_memory=70 * GIB)],
        retunes_of=lambda run_id: retunes,
        sleep=slept.append,
    )


TWO_GPUS = [
    GpuState(uuid="GPU-a", index=0, memory_total=80 * GIB, memory_used=79 * GIB, lost=False),
    GpuState(uuid="GPU-b", index=1, memory_total=80 * GIB, memory_used=2 * GIB, lost=False),
]


def test_contention_waits_instead_of_shrinking() -> None:
    slept: list[float] = []
    decision = _hook([], slept, TWO_GPUS)(RUN, _end(), [])
    assert decision is not None
    assert decision.verdict == "gpu_contention"
    assert slept and slept[0] > 0  # waited for the other process to let go
    assert decision.spec["knobs"]["batch_size"] == 32  # never shrunk
    assert decision.evidence is not None and decision.evidence["decision"]["action"] == "wait_for_memory"


class Clock:
    """Time that passes only when the hook sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _said(notes: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [str(payload["message"]) for kind, payload in notes if kind == "waiting"]


def test_a_wait_for_memory_is_said_every_few_seconds_while_it_lasts() -> None:
    clock, notes = Clock(), []
    hook = OomRetune(
        gpu_states=lambda: TWO_GPUS, gpu_processes=lambda: [], retunes_of=lambda run_id: [],
        sleep=clock.sleep, clock=clock, heartbeat_s=2.5,
    )  # fmt: skip
    decision = hook(RUN, _end(), [], lambda kind, /, **payload: notes.append((kind, payload)))
    assert decision is not None and decision.evidence is not None
    wait_s = decision.evidence["decision"]["wait_s"]
    assert sum(clock.slept) == wait_s and max(clock.slept) <= 2.5  # never silent for longer
    said = _said(notes)
    assert said[0] == f"waiting for other processes to free GPU memory: 0 of {wait_s:.0f} s"
    assert said[1] == f"waiting for other processes to free GPU memory: 2 of {wait_s:.0f} s"
    assert len(said) == len(clock.slept)


def test_the_wait_for_the_failed_attempts_memory_is_said_while_it_is_held() -> None:
    clock, notes = Clock(), []
    end = AttemptEnd(**{**_end().__dict__, "pid": 4242})
    held = [GpuProcess(ts=0, uuid="GPU-a", pid=4242, used_memory=70 * GIB)]

    def processes() -> list[GpuProcess]:
        return held if clock.now < 1006 else []  # its CUDA context is gone after 6 s

    hook = OomRetune(
        gpu_states=lambda: TWO_GPUS, gpu_processes=processes, retunes_of=lambda run_id: [],
        sleep=clock.sleep, clock=clock, heartbeat_s=2.5,
    )  # fmt: skip
    hook(RUN, end, [], lambda kind, /, **payload: notes.append((kind, payload)))
    released = _said(notes)[:3]
    assert released == [
        "waiting for attempt 1's GPU memory to be released: 0 of 30 s",
        "waiting for attempt 1's GPU memory to be released: 2 of 30 s",
        "waiting for attempt 1's GPU memory to be released: 5 of 30 s",
    ]


def test_after_the_waits_it_moves_to_the_freer_gpu() -> None:
    waited = [{"ts": 0.0, "evidence": {"decision": {"action": "wait_for_memory"}}} for _ in range(3)]
    slept: list[float] = []
    decision = _hook(waited, slept, TWO_GPUS)(RUN, _end(), [])
    assert decision is not None
    assert decision.spec["resources"]["gpus"] == ["GPU-b"]
    assert decision.to == {"resources.gpus": ["GPU-b"]}
    assert decision.spec["knobs"]["batch_size"] == 32


def test_nowhere_to_move_gives_up_with_the_reason() -> None:
    waited = [{"ts": 0.0, "evidence": {"decision": {"action": "wait_for_memory"}}} for _ in range(3)]
    with pytest.raises(RetuneGiveUp, match="no other GPU"):
        _hook(waited, [], TWO_GPUS[:1])(RUN, _end(), [])


# -- gangs: the failed rank's evidence, its GPU moved or the gang made smaller ---------------------------

GANG: dict[str, Any] = {
    "id": "r2",
    "run_dir": "/nonexistent",
    "spec": {
        "name": "ddp",
        "kind": "train",
        "resources": {"gpus": 2},
        "train": {"task": "image", "batch_size": 8, "grad_accum_steps": 1, "world_size": 2},
        "policy": {"base": "default", "allow": ["world_size"]},
    },
}
WAITED = [{"ts": 0.0, "evidence": {"decision": {"action": "wait_for_memory"}}} for _ in range(3)]


def _gang_end() -> AttemptEnd:
    return AttemptEnd(
        number=1, outcome="oom", reason="rank 1: out of memory", exit_code=3, signal=None, oom_kill=None,
        stderr_tail=CONTENTION, gpus=["GPU-a", "GPU-b"], gpu_capacity=80 * GIB, host_capacity=None,
        adopted=False, pid=None, rank=1, world_size=2,
    )  # fmt: skip


def _gang_events() -> list[dict[str, Any]]:
    progress = {"type": "progress", "attempt": 1, "source": "runner", "step": 3, "batch_size": 8}
    return [
        {**progress, "rank": 0, "mem_reserved": 30 * GIB},
        {**progress, "rank": 1, "mem_reserved": 20 * GIB},
        {"type": "oom", "attempt": 1, "source": "runner", "rank": 1, "verdict": "gpu_contention",
         "message": CONTENTION, "ts": 1.0},
        {"type": "error", "attempt": 1, "source": "runner", "rank": 0, "code": "gang_aborted", "message": "x"},
    ]  # fmt: skip


def _gpus(*used_gib: float, lost: int | None = None) -> list[GpuState]:
    return [
        GpuState(f"GPU-{'abcd'[i]}", i, 80 * GIB, int(u * GIB), lost=i == lost)
        for i, u in enumerate(used_gib)
    ]


def test_only_the_failed_ranks_events_reach_the_retune() -> None:
    kept = rank_events(_gang_events(), _gang_end())
    assert [(e["type"], e.get("rank")) for e in kept] == [("progress", 1), ("oom", 1)]
    readopted = AttemptEnd(**{**_gang_end().__dict__, "rank": None})  # decided again after a restart
    assert [e.get("rank") for e in rank_events(_gang_events(), readopted)] == [1, 1]


def test_a_gang_moves_the_failed_ranks_gpu_and_keeps_the_others() -> None:
    decision = _hook(WAITED, [], _gpus(1, 75, 70, 2))(GANG, _gang_end(), _gang_events())
    assert decision is not None and decision.verdict == "gpu_contention"
    assert decision.to == {"resources.gpus": ["GPU-a", "GPU-d"]}  # rank 1's GPU-b → the freest other


def test_with_no_gpu_to_move_to_a_gang_shrinks_when_its_policy_allows() -> None:
    moved = [*WAITED, {"ts": 0.0, "evidence": {"decision": {"action": "move_gpu"}}}]
    # GPU-b is taken by another process; GPU-c fell off the bus; only GPU-a has room for a rank
    decision = _hook(moved, [], _gpus(1, 75, 1, lost=2))(GANG, _gang_end(), _gang_events())
    assert decision is not None
    assert decision.to == {"train.world_size": 1, "train.grad_accum_steps": 2, "resources.gpus": 1}
    train = decision.spec["train"]
    assert train["batch_size"] * train["grad_accum_steps"] * train["world_size"] == 16  # kept


def test_a_run_stopped_before_a_probe_gives_up_instead_of_probing(tmp_path: Path) -> None:
    # The shipped out-of-memory example: its recovery probes two micro-batches, each a process.
    spec = yaml.safe_load((REPO / "configs" / "examples" / "oom-recovery-cpu.yaml").read_text())
    run = {"id": "r1", "run_dir": str(tmp_path), "spec": spec}
    end = AttemptEnd(
        number=1, outcome="oom", reason="oom", exit_code=3, signal=None, oom_kill=None,
        stderr_tail="RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes.",
        gpus=[], gpu_capacity=None, host_capacity=int(1.6 * GIB), adopted=False, pid=None,
    )  # fmt: skip
    oom = {
        "type": "oom",
        "attempt": 1,
        "source": "runner",
        "verdict": "host_oom",
        "batch_size": 32,
        "step": 0,
    }
    asked: list[str] = []

    def stopped(run_id: str) -> bool:
        asked.append(run_id)
        return True

    hook = OomRetune(
        gpu_states=lambda: [], gpu_processes=lambda: [], retunes_of=lambda run_id: [], stopped=stopped
    )
    with pytest.raises(RetuneGiveUp, match="stopped while probing"):
        hook(run, end, [oom])
    assert asked == ["r1"]  # asked once, before the first probe: none started


def test_a_shape_measured_before_is_retuned_from_what_was_remembered_without_a_probe(tmp_path: Path) -> None:
    # The shipped example under its 1.4 GiB limit, whose sizes an earlier run's probes measured
    # (the runner's peaks at 4 × 8 and 16 × 2): no probe starts (one would find the run stopped).
    spec = yaml.safe_load((REPO / "configs" / "examples" / "oom-recovery-cpu.yaml").read_text())
    limit = int(1.4 * GIB)
    remembered = MemoryPoints(tmp_path / "memory")
    key = memory_key(spec_from_mapping(spec), on_gpu=False, capacity=limit)
    assert key is not None
    remembered.add(key, [(4, 960_258_048), (16, 1_409_343_488)])
    end = AttemptEnd(
        number=1, outcome="oom", reason="oom", exit_code=3, signal=None, oom_kill=None,
        stderr_tail="RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 75497472 bytes.",
        gpus=[], gpu_capacity=None, host_capacity=limit, adopted=False, pid=None,
    )  # fmt: skip
    oom = {
        "type": "oom",
        "attempt": 1,
        "source": "runner",
        "verdict": "host_oom",
        "batch_size": 32,
        "step": 0,
    }
    hook = OomRetune(
        gpu_states=lambda: [],
        gpu_processes=lambda: [],
        retunes_of=lambda run_id: [],
        stopped=lambda run_id: True,
        memory_points=remembered,
    )
    decision = hook({"id": "r2", "run_dir": str(tmp_path), "spec": spec}, end, [oom])
    assert decision is not None
    assert decision.to == {"train.batch_size": 16, "train.grad_accum_steps": 2}
    assert decision.evidence is not None and decision.evidence["probes"] == []
    assert decision.evidence["decided"] == (
        "decided from 2 sizes remembered from a run of the same shape, no probe"
    )
    # Another limit is another shape's memory: nothing remembered there.
    assert memory_key(spec_from_mapping(spec), on_gpu=False, capacity=2 * GIB) != key


def test_a_users_program_is_not_probed_the_restart_measures_its_size(tmp_path: Path) -> None:
    # The shipped plain-script example names every role a probe needs, yet a probe of it would be a
    # start of the program, as costly as the restart: none starts (one would find the run stopped
    # and give up), and the restart takes the size its three measured steps point to.
    spec = yaml.safe_load((REPO / "configs" / "examples" / "own-script-plain-cpu.yaml").read_text())
    spec["command"]["cwd"] = str(REPO)
    spec["command"]["config_file"] = str(REPO / "examples" / "plain_pytorch" / "config.yaml")
    spec["knobs"].update(batch_size=16, grad_accum=1, max_steps=4)  # as submitted: read from its config
    limit = int(1.25 * GIB)
    end = AttemptEnd(
        number=1, outcome="oom", reason="oom", exit_code=3, signal=None, oom_kill=None,
        stderr_tail="RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 268435456 bytes.",
        gpus=[], gpu_capacity=None, host_capacity=limit, adopted=False, pid=None,
    )  # fmt: skip
    steps = [
        {"type": "progress", "attempt": 1, "source": "runner", "step": step, "batch_size": 16,
         "vm_peak": 900 * (1 << 20), "mem_peak": 400 * (1 << 20)}
        for step in (1, 2, 3)
    ]  # fmt: skip
    oom = {
        "type": "oom",
        "attempt": 1,
        "source": "runner",
        "verdict": "host_oom",
        "batch_size": 16,
        "step": 4,
    }
    hook = OomRetune(
        gpu_states=lambda: [],
        gpu_processes=lambda: [],
        retunes_of=lambda run_id: [],
        stopped=lambda run_id: True,
    )
    decision = hook({"id": "r3", "run_dir": str(tmp_path), "spec": spec}, end, [*steps, oom])
    assert decision is not None
    assert decision.to == {"knobs.batch_size": 8, "knobs.grad_accum": 2}
    assert decision.evidence is not None and decision.evidence["probes"] == []
    assert (
        decision.evidence["decided"]
        == "decided from 3 measured steps, no probe: the restart measures its size itself"
    )
    assert not (tmp_path / "probes").exists()
