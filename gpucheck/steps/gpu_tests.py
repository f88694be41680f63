"""The `gpu`-marked tests, all in tests/gpu (the OOM scenarios run as steps of their own); the
other folders are not collected: some need packages only a development install has."""

from __future__ import annotations

from gpucheck.result import StepResult
from gpucheck.steps.pytest_run import run_pytest

HEAVY = "tests/gpu/test_llm_oom.py"


def run(name: str) -> StepResult:
    from gpucheck.steps.oom import EXEC

    return run_pytest(name, ["-m", "gpu", f"--deselect={HEAVY}", f"--deselect={EXEC}", "tests/gpu"])
