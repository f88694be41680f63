"""Real CUDA out-of-memory recoveries through the daemon (tests/gpu/test_llm_oom.py) and through
`gpuwarden exec` with no daemon (tests/gpu/test_exec_oom.py), one scenario per step so that each
stays inside its time limit."""

from __future__ import annotations

from gpucheck.result import StepResult
from gpucheck.steps.gpu_tests import HEAVY
from gpucheck.steps.pytest_run import run_pytest

EXEC = "tests/gpu/test_exec_oom.py"
TESTS = {
    "oom-train": "test_llm_training_oom_keeps_the_effective_batch_and_reaches_the_full_card_weights",
    "oom-generate": "test_llm_generation_oom_loses_and_repeats_no_item",
    "oom-fragmentation": "test_a_fragmenting_workload_is_recovered_by_expandable_segments",
}


def run(name: str) -> StepResult:
    if name == "exec-oom":
        return run_pytest(name, [EXEC])
    return run_pytest(name, [f"{HEAVY}::{TESTS[name]}"])
