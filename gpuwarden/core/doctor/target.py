"""What doctor judges a spec against: a GPU of some memory tier, or the CPU.

Advice depends on the device: mixed precision, compile, TF32, pinned memory and cuDNN autotuning
speed up GPU runs and do nothing (or harm) on a CPU. The target comes from `--gpu-memory` (a GPU
of that size, for advice about another machine), else from the spec (`resources.gpus: 0` is a
CPU run), else from the GPU detected here, else the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.classify import format_size, parse_size
from gpuwarden.core.telemetry.types import GpuReader
from gpuwarden.core.units import GIB

# Smallest value `--gpu-memory` accepts; smaller numbers are almost surely a missing unit.
MIN_GPU_MEMORY = 1 << 30


@dataclass(frozen=True)
class Target:
    """The device a spec is judged for."""

    device: Literal["gpu", "cpu"]
    source: str  # how the target was chosen, for the output
    cores: int  # CPU cores this process may use (DataLoader workers compete for them)
    memory_total: int | None = None
    gpu_name: str | None = None
    # None when unknown (a tier given by size only): every CUDA GPU of a profiled tier has fp16.
    bf16: bool | None = None

    @property
    def gpu(self) -> bool:
        return self.device == "gpu"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "source": self.source,
            "cores": self.cores,
            "memory_total": self.memory_total,
            "gpu_name": self.gpu_name,
            "bf16": self.bf16,
        }


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parse_gpu_memory(text: str) -> int:
    """`--gpu-memory 24GiB` → bytes; a one-line UserError for anything else."""
    try:
        value = parse_size(text.strip())
    except ValueError:
        raise UserError(f"--gpu-memory {text!r}: not a size — write e.g. 24GiB or 80GB") from None
    if value < MIN_GPU_MEMORY:
        # A bare number was most likely meant in GiB ("24" for a 24 GiB card); zero was not.
        bare = text.strip().replace(".", "", 1).isdigit() and value > 0
        fix = f"did you mean {text.strip()}GiB?" if bare else "give the card's memory, e.g. 24GiB"
        raise UserError(f"--gpu-memory {text!r}: {format_size(value)} is too small — {fix}")
    return value


def bf16_from_capability(capability: str | None) -> bool | None:
    """bf16 tensor cores arrive with compute capability 8.0 (Ampere)."""
    if not capability:
        return None
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        return None
    return major >= 8


def gpu_target(
    memory_total: int | None, name: str | None, capability: str | None, source: str, cores: int
) -> Target:
    return Target(
        device="gpu",
        source=source,
        cores=cores,
        memory_total=memory_total,
        gpu_name=name,
        bf16=bf16_from_capability(capability),
    )


def detect_target(
    gpu_memory: int | None,
    wants_gpu: bool,
    reader_factory: Callable[[], GpuReader] | None = None,
    cores: int | None = None,
) -> Target:
    """The target for a spec: `--gpu-memory`, a CPU spec, the detected GPU, or the CPU."""
    n = cores if cores is not None else usable_cores()
    if gpu_memory is not None:
        return Target(
            device="gpu", source=f"--gpu-memory {gpu_memory / GIB:g} GiB", cores=n, memory_total=gpu_memory
        )
    if not wants_gpu:
        return Target(device="cpu", source="the spec asks for no GPU (resources.gpus: 0)", cores=n)
    if reader_factory is None:
        from gpuwarden.core.telemetry.nvml import open_gpu_reader

        reader_factory = open_gpu_reader
    reader = reader_factory()
    try:
        statics = reader.gpus() if reader.status is None else []
        status = reader.status
    finally:
        reader.close()
    if not statics:
        why = status or "no GPUs found"
        return Target(
            device="cpu", source=f"no GPU detected here ({why}); the run would use the CPU", cores=n
        )
    # The daemon places a run on the GPU with the most free memory; judge against the largest.
    best = max(statics, key=lambda g: g.memory_total or 0)
    return gpu_target(
        best.memory_total, best.name, best.compute_capability, f"detected GPU {best.index}: {best.name}", n
    )
