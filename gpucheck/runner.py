"""Runs one step in its own process session under its time limit (`window.py` runs them in turn).

A step that crashes or overruns becomes an `error` / `timeout` result naming the last line it
logged, and the next step still runs: one broken step never hides the others' figures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gpucheck.result import RESULT_ENV, StepResult, read_result


def run_step(
    name: str, argv: Sequence[str], timeout_s: float, logs: Path, env: dict[str, str] | None = None
) -> StepResult:
    """Run one step's command; its result, or why there is none."""
    logs.mkdir(parents=True, exist_ok=True)
    result_path, log_path = logs / f"{name}.json", logs / f"{name}.log"
    result_path.unlink(missing_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**(env if env is not None else os.environ), RESULT_ENV: str(result_path)},
            start_new_session=True,  # its children (daemons, runners, probes) go with it
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - start
    result = read_result(result_path)
    if code is None:
        result = StepResult(name, "timeout", f"stopped after {timeout_s:.0f} s: {_last_line(log_path)}")
    elif result is None:
        result = StepResult(name, "error", f"exited {code} without a result: {_last_line(log_path)}")
    result.seconds = round(seconds, 1)
    result.log = str(log_path)
    return result


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"
