"""The daemon's OOM hook when other processes hold the memory: wait (bounded), then move GPU —
never shrink the run (the classic "25.84 GiB allocated on a 12 GB card?")."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.telemetry.types import GpuProcess
from gpuwarden.daemon.oom_retune import OomRetune
from gpuwarden.daemon.placement import GpuState
from gpuwarden.daemon.supervise import AttemptEnd, RetuneGiveUp

GIB = 1 << 30
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
