"""The `gpu`-marked tests of the suite (the heavy OOM scenarios run as their own steps)."""

from __future__ import annotations

from gpucheck.result import StepResult
from gpucheck.steps.pytest_run import run_pytest

HEAVY = "tests/gpu/test_llm_oom.py"


def run(name: str) -> StepResult:
    return run_pytest(name, ["-m", "gpu", f"--deselect={HEAVY}", "tests"])
