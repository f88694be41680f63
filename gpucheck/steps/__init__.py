"""The steps of `make gpu-check`, in the order they run — the order of their value: first what
has targets still to meet or has never run on a GPU, last the longest — each one module's
`run(name)`. `expect_s`: about how long the step takes on an H100 (the report's own time replaces
it once the step has run), for fitting steps into a short GPU window (`gpucheck/window.py`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

# Every step must end well inside ten minutes (the limit a lent GPU machine puts on one command).
STEP_TIMEOUT_S = 540.0


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    module: str  # gpucheck.steps.<module>: `run(name) -> StepResult`
    needs: Literal["nvml", "cuda"] = "cuda"
    timeout_s: float = STEP_TIMEOUT_S
    expect_s: float = 120.0

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "gpucheck.step", self.name]


STEPS: tuple[Step, ...] = (
    Step(
        "nvml-cost",
        "CPU time per sampler tick against nvidia-smi, nvitop and gpustat",
        "gpucheck.steps.nvml_cost",
        needs="nvml",
        expect_s=45.0,
    ),
    Step(
        "daemon-cost",
        "the daemon's CPU and RSS at 1 Hz on the real driver",
        "gpucheck.steps.daemon",
        needs="nvml",
        expect_s=65.0,
    ),
    Step(
        "exec-oom",
        "the same kind of CUDA OOM recovered by `gpuwarden exec` inside a job, with no daemon",
        "gpucheck.steps.oom",
        expect_s=150.0,
    ),
    Step(
        "oom-train",
        "a ~0.5 B causal LM under a 12 GB cap: training recovered, effective batch kept, weights as an "
        "uninterrupted run on the full card",
        "gpucheck.steps.oom",
        expect_s=170.0,
    ),
    Step(
        "gpu-tests",
        "the gpu-marked tests (real NVML, a real CUDA OOM recovered)",
        "gpucheck.steps.gpu_tests",
        expect_s=100.0,
    ),
    Step(
        "nvml-truth",
        "every metric the sampler stores against nvidia-smi at the same moment, idle and under load; "
        "what the card does not support",
        "gpucheck.steps.nvml_truth",
        expect_s=30.0,
    ),
    Step(
        "oom-generate",
        "the same LLM generating under a 12 GB cap: no item lost or duplicated",
        "gpucheck.steps.oom",
        expect_s=115.0,
    ),
    Step(
        "oom-fragmentation",
        "a workload that fragments the allocator: recovered by expandable_segments",
        "gpucheck.steps.oom",
        expect_s=20.0,
    ),
    Step(
        "dashboard",
        "the dashboard's first paint over a daemon with the real GPUs",
        "gpucheck.steps.daemon",
        needs="nvml",
        expect_s=10.0,
    ),
    Step(
        "speed-train",
        "training runner vs a naive and a hand-tuned loop",
        "gpucheck.steps.speed",
        expect_s=100.0,
    ),
    Step("speed-generate", "generation: best batch vs batch 1", "gpucheck.steps.speed", expect_s=55.0),
    # Estimates (docs/gpu-check.md: 7 s a probe process, 20 s compiled): 20 sweep probes; three
    # searches of about 6 probes and up to 6 re-measures.
    Step(
        "tune-sweep", "the exhaustive sweep tune is measured against", "gpucheck.steps.speed", expect_s=270.0
    ),
    Step(
        "tune-vs-sweep",
        "tune with precision and compile vs the sweep",
        "gpucheck.steps.speed",
        expect_s=285.0,
    ),
)


def by_name(name: str) -> Step:
    for step in STEPS:
        if step.name == name:
            return step
    raise KeyError(name)
