"""The `gpu`-marked tests, all in tests/gpu (the heavy OOM scenarios run as their own steps); the
other folders are not collected: some need packages only a development install has."""

from __future__ import annotations

from gpucheck.result import StepResult
from gpucheck.steps.pytest_run import run_pytest

HEAVY = "tests/gpu/test_llm_oom.py"


def run(name: str) -> StepResult:
    return run_pytest(name, ["-m", "gpu", f"--deselect={HEAVY}", "tests/gpu"])
