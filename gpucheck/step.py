"""`python -m gpucheck.step NAME`: one step in its own process; its result goes to $GPUCHECK_RESULT.

Without what the step needs (NVML with a GPU, or torch with CUDA) the step is skipped with the
reason, in one line, and the process exits 0. `GPUCHECK_DRY=1` skips every step on purpose.
"""

from __future__ import annotations

import importlib
import os
import sys

from gpucheck.machine import cuda_missing, nvml_missing
from gpucheck.result import StepResult, write_result
from gpucheck.steps import STEPS, by_name

DRY_ENV = "GPUCHECK_DRY"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m gpucheck.step NAME — one of: " + ", ".join(s.name for s in STEPS),
            file=sys.stderr,
        )
        return 2
    try:
        step = by_name(argv[0])
    except KeyError:
        print(f"unknown step {argv[0]!r} — one of: {', '.join(s.name for s in STEPS)}", file=sys.stderr)
        return 2
    if os.environ.get(DRY_ENV):
        result = StepResult(step.name, "skipped", "dry run: nothing measured")
    else:
        missing = nvml_missing() if step.needs == "nvml" else cuda_missing()
        if missing is not None:
            result = StepResult(step.name, "skipped", missing)
        else:
            result = importlib.import_module(step.module).run(step.name)
    write_result(result)
    print(f"{step.name}: {result.status} — {result.summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
