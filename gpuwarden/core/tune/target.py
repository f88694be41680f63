"""Where a tune (or a run) will execute: the GPU it gets, or the CPU, and the memory it has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GpuStatic


@dataclass(frozen=True)
class Target:
    """The device a probe runs on and the memory a candidate must fit in."""

    device: dict[str, Any]  # name/memory facts that go into the fingerprint
    capacity: int | None  # bytes a run's peak is measured against
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES etc. for the probe processes
    precisions: list[str]  # precisions worth probing here, beyond the spec's own
    compile_options: list[bool]
    note: str | None = None
    gpu: GpuStatic | None = None  # the GPU probed, when it is one

    @property
    def energy_missing(self) -> str | None:
        """Why probes here cannot give joules per sample, or None when they can."""
        if self.gpu is None:
            return "on the CPU there is no energy counter"
        if "energy_mj" in self.gpu.unsupported:
            return f"GPU {self.gpu.index} ({self.gpu.name}) does not report its energy counter (NVML)"
        return None


def pick_target(spec: RunSpec, gpus: list[GpuStatic]) -> Target:
    """The first GPU the spec may use (by index or UUID), else the CPU when allowed."""
    wanted = spec.resources.gpus
    if gpus and wanted != 0:
        if isinstance(wanted, list):
            matches = [g for g in gpus if str(g.index) in wanted or g.uuid in wanted]
            if not matches:
                known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
                raise UserError(f"resources.gpus {wanted}: no such GPU here — use one of: {known}")
            gpu = matches[0]
        else:
            gpu = gpus[0]
        return Target(
            device={"type": "cuda", "name": gpu.name, "memory_total": gpu.memory_total},
            capacity=gpu.memory_total,
            env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpu.uuid},
            # On a GPU the runner's "auto" is bf16/fp16; fp32 is probed only when asked for.
            precisions=["auto"],
            compile_options=[True],
            gpu=gpu,
        )
    if wanted != 0 and not spec.resources.allow_cpu:
        raise UserError("no NVIDIA GPU here and resources.allow_cpu is false — tune on a GPU machine")
    host = psutil.virtual_memory().total
    limit = int(spec.resources.memory_limit) if spec.resources.memory_limit else None
    capacity = min(host, limit) if limit else host
    return Target(
        device={"type": "cpu", "name": "cpu", "memory_total": capacity},
        capacity=capacity,
        env={"CUDA_VISIBLE_DEVICES": ""},
        precisions=[],
        compile_options=[],
        note="on the CPU only the micro-batch is searched: reduced precision is slower there and "
        "compile time dominates a short probe",
    )
