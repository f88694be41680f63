"""The check inside one short GPU window: what still has to run, and whether it fits the time left.

A lent GPU machine comes for minutes at a time, and may not come again soon. So the check runs
first the steps that have not passed for the code as it is now (a step that passed for other code
runs again), in the order of `STEPS` (their value), skips a step whose expected time no longer
fits the window (its last recorded time, else its estimate) and tries the shorter ones after it,
and saves the report after every step: consecutive windows complete one report without running
again what passed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.result import StepResult

# What a step's result depends on: the product, the check, the figures' code, the GPU tests, and
# what is installed.
CODE_FOLDERS = ("gpuwarden", "gpucheck", "bench", "tests/gpu")
CODE_FILES = ("pyproject.toml", "constraints.txt")
# A step is started only with this much of the window left beyond its expected time.
MARGIN_S = 10.0


def code_fingerprint(root: Path) -> str:
    """A short hash of every source file the check's results depend on (no git needed: a GPU
    machine may get a copy of the working tree without its history)."""
    digest = hashlib.sha256()
    files = [root / name for name in CODE_FILES if (root / name).is_file()]
    for folder in CODE_FOLDERS:
        files += sorted((root / folder).rglob("*.py"))
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def recorded(report: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The report's step entries by name."""
    steps = (report or {}).get("steps", [])
    return {s["name"]: s for s in steps if isinstance(s, dict) and isinstance(s.get("name"), str)}


def still_to_run(names: Sequence[str], report: Mapping[str, Any] | None, code: str) -> list[str]:
    """`names` less the steps that passed for `code`."""
    done = recorded(report)
    return [
        n for n in names if not (done.get(n, {}).get("status") == "passed" and done[n].get("code") == code)
    ]


def expected_seconds(name: str, estimate: float, report: Mapping[str, Any] | None) -> float:
    """How long the step will take: the time it took when it last ran (not when it was skipped,
    which takes no time), else `estimate`."""
    entry = recorded(report).get(name, {})
    seconds = entry.get("seconds")
    ran = entry.get("status") not in (None, "skipped")
    return float(seconds) if ran and isinstance(seconds, int | float) and seconds > 0 else estimate


@dataclass(frozen=True)
class WindowStep:
    name: str
    argv: Sequence[str]
    timeout_s: float
    expect_s: float


@dataclass
class WindowRun:
    """What one window did: the results, and the steps left for the next one."""

    results: list[StepResult] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


Runner = Callable[[str, Sequence[str], float], StepResult]


def run_in_window(
    steps: Sequence[WindowStep],
    deadline: float,
    run: Runner,
    *,
    report: Mapping[str, Any] | None,
    code: str,
    on_done: Callable[[StepResult], None],
    clock: Callable[[], float] = time.time,
) -> WindowRun:
    """Run each step that fits before `deadline` (wall-clock seconds), in order; a step runs at
    most until the deadline. `on_done` gets each result as it comes (the caller saves it)."""
    out = WindowRun()
    for step in steps:
        left = deadline - clock()
        if expected_seconds(step.name, step.expect_s, report) + MARGIN_S > left:
            out.left.append(step.name)
            continue
        result = run(step.name, step.argv, min(step.timeout_s, left))
        result.code = code
        out.results.append(result)
        on_done(result)
    return out
