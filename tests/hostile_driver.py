"""Run many `gpuwarden` command lines in one process and report each outcome as JSON.

Used by the hostile-corpus tests: one interpreter per command instead of one per file keeps the
corpus fast, and this process's peak memory (ru_maxrss) bounds what every file cost at once.
Reads `{"cases": [{"argv": [...], "env": {...}}, ...]}` on stdin; the first case is a benign
warm-up whose peak is the baseline. Writes `{"results": [...], "baseline_kb": N, "peak_kb": N}`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gpuwarden.cli.main import main


def run_case(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # what the real entry point would print: a traceback
                traceback.print_exc(file=err)
                code = 1
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    seconds = time.perf_counter() - start
    return {
        "argv": argv,
        "code": code,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "seconds": seconds,
    }


def peak_kb() -> int:
    """This process's peak resident memory since `reset_peak` (VmHWM). Not ru_maxrss: on Linux it
    keeps the peak of the process this one was forked from before its exec, so a parent that had
    grown (a benchmark that wrote a 50 MB corpus) would hide what the cases cost."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def reset_peak() -> None:
    """Start the peak over from the current resident memory (Linux's clear_refs, value 5)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def drive() -> None:
    cases = json.loads(sys.stdin.read())["cases"]
    warmup, *rest = cases
    results = [run_case(warmup["argv"], warmup.get("env", {}))]
    reset_peak()
    baseline = peak_kb()
    results += [run_case(c["argv"], c.get("env", {})) for c in rest]
    # The commands under test may have replaced sys.stdout; the parent reads the real one.
    out = sys.__stdout__
    assert out is not None
    out.write(json.dumps({"results": results, "baseline_kb": baseline, "peak_kb": peak_kb()}))


if __name__ == "__main__":
    drive()
