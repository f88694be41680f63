"""GPU placement by free memory, per-GPU run limits, named GPUs and the CPU fallback."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.config.spec import Resources
from gpuwarden.core.errors import UserError
from gpuwarden.daemon.placement import GpuState, check_feasible, place

GIB = 1024**3
GPUS = [
    GpuState("GPU-aaa", 0, 80 * GIB, 70 * GIB),
    GpuState("GPU-bbb", 1, 80 * GIB, 10 * GIB),
    GpuState("GPU-ccc", 2, 80 * GIB, 40 * GIB),
]


def _res(**kw: Any) -> Resources:
    return Resources.model_validate(kw)


def test_picks_the_gpus_with_most_free_memory() -> None:
    assert place(_res(gpus=1), GPUS, {}, 1).gpus == ["GPU-bbb"]  # type: ignore[union-attr]
    assert place(_res(gpus=2), GPUS, {}, 1).gpus == ["GPU-bbb", "GPU-ccc"]  # type: ignore[union-attr]
    env = place(_res(gpus=1), GPUS, {}, 1).env()  # type: ignore[union-attr]
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-bbb"}


def test_busy_gpus_and_min_free_memory_make_runs_wait() -> None:
    busy = {"GPU-bbb": 1}
    assert place(_res(gpus=1), GPUS, busy, 1).gpus == ["GPU-ccc"]  # type: ignore[union-attr]
    assert place(_res(gpus=1), GPUS, busy, 2).gpus == ["GPU-bbb"]  # type: ignore[union-attr]
    assert place(_res(gpus=3), GPUS, busy, 1) is None
    assert place(_res(gpus=1, min_free_memory="50GiB"), GPUS, busy, 1) is None
    assert place(_res(gpus=1, min_free_memory="30GiB"), GPUS, busy, 1).gpus == ["GPU-ccc"]  # type: ignore[union-attr]
    lost = [GpuState("GPU-x", 0, 80 * GIB, 0, lost=True)]
    assert place(_res(gpus=1), lost, {}, 1) is None


def test_named_gpus_by_index_or_uuid() -> None:
    assert place(_res(gpus=["0", "GPU-ccc"]), GPUS, {}, 1).gpus == ["GPU-aaa", "GPU-ccc"]  # type: ignore[union-attr]
    assert place(_res(gpus=["0"]), GPUS, {"GPU-aaa": 1}, 1) is None
    with pytest.raises(UserError, match="no single GPU matches '7'"):
        check_feasible(_res(gpus=["7"]), GPUS)


def test_cpu_runs_and_machines_without_gpus() -> None:
    cpu = place(_res(gpus=0), GPUS, {}, 1)
    assert cpu is not None and cpu.cpu and cpu.warning is None
    assert cpu.env()["CUDA_VISIBLE_DEVICES"] == ""
    fallback = place(_res(gpus=1), [], {}, 1)
    assert fallback is not None and fallback.cpu and "CPU" in (fallback.warning or "")
    assert place(_res(gpus=1, allow_cpu=False), [], {}, 1) is None
    with pytest.raises(UserError, match="allow_cpu is false"):
        check_feasible(_res(gpus=1, allow_cpu=False), [])
    with pytest.raises(UserError, match="asks for 4 GPUs but this machine has 3"):
        check_feasible(_res(gpus=4), GPUS)
