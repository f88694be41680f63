"""The GPU check inside one short GPU window: only what has not passed for this code, in order,
each step only when it fits the time left, the report saved after every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpucheck.result import StepResult
from gpucheck.window import WindowStep, code_fingerprint, run_in_window, still_to_run

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_step_passed_for_this_code_is_not_run_again() -> None:
    report = {
        "steps": [
            {"name": "a", "status": "passed", "code": "new"},
            {"name": "b", "status": "passed", "code": "old"},
            {"name": "c", "status": "failed", "code": "new"},
            {"name": "d", "status": "skipped", "code": "new"},
        ]
    }
    assert still_to_run(["a", "b", "c", "d", "e"], report, "new") == ["b", "c", "d", "e"]


def test_steps_run_while_they_fit_and_the_shorter_ones_after_a_long_one_still_do() -> None:
    clock = Clock()
    durations = {"first": 100.0, "long": 250.0, "short": 50.0, "last": 145.0}
    ran: list[tuple[str, float]] = []
    saved: list[str] = []

    def run(name: str, argv: Sequence[str], timeout: float) -> StepResult:
        ran.append((name, timeout))
        clock.now += durations[name]
        return StepResult(name, "passed", "ok", seconds=durations[name])

    # The report knows how long `short` took last time (not its estimate); `last`'s skipped
    # entry took no time and says nothing about it.
    report = {
        "steps": [
            {"name": "short", "status": "failed", "seconds": 50.0},
            {"name": "last", "status": "skipped", "seconds": 0.1},
        ]
    }
    steps = [
        WindowStep("first", ["x"], 540, expect_s=100),
        WindowStep("long", ["x"], 540, expect_s=250),
        WindowStep("short", ["x"], 540, expect_s=500),
        WindowStep("last", ["x"], 540, expect_s=145),
    ]
    window = run_in_window(
        steps,
        clock.now + 300,
        run,
        report=report,
        code="c0de",
        on_done=lambda r: saved.append(r.name),
        clock=clock,
    )
    # 150 s were left for `last`: its estimate (145 s) and the margin are more.
    assert [name for name, _ in ran] == ["first", "short"]
    assert window.left == ["long", "last"]
    assert ran[1][1] == 200  # a step runs at most until the window ends
    assert saved == ["first", "short"] and all(r.code == "c0de" for r in window.results)


def test_the_fingerprint_follows_the_code_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "gpuwarden").mkdir()
    (tmp_path / "gpuwarden" / "a.py").write_text("x = 1\n")
    before = code_fingerprint(tmp_path)
    (tmp_path / "notes.txt").write_text("not code")
    assert code_fingerprint(tmp_path) == before
    (tmp_path / "gpuwarden" / "a.py").write_text("x = 2\n")
    assert code_fingerprint(tmp_path) != before


def _gpucheck(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GPUCHECK_DRY", None)
    return subprocess.run(
        [sys.executable, "-m", "gpucheck", "--dry", "--out", str(out), "--logs", str(out / "logs"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_the_next_window_goes_on_with_what_has_not_passed_for_this_code(tmp_path: Path) -> None:
    code = code_fingerprint(REPO)
    earlier = {
        "version": 1,
        "machine": {},
        "steps": [
            {"name": "nvml-cost", "status": "passed", "summary": "within target", "code": code},
            {"name": "daemon-cost", "status": "passed", "summary": "within target", "code": "0ld"},
        ],
    }
    (tmp_path / "gpu-report.json").write_text(json.dumps(earlier))
    done = _gpucheck(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "passed for this code already (--again runs them): nvml-cost" in done.stdout
    assert "nvml-cost:" not in done.stdout.replace("already (--again runs them): nvml-cost", "")
    assert "daemon-cost: skipped" in done.stdout  # passed, but for other code
    steps = {s["name"]: s for s in json.loads((tmp_path / "gpu-report.json").read_text())["steps"]}
    assert steps["nvml-cost"]["status"] == "passed" and steps["daemon-cost"]["status"] == "skipped"
    again = _gpucheck(tmp_path, "--again")
    assert "nvml-cost: skipped" in again.stdout


def test_a_budget_that_is_not_a_time_is_refused(tmp_path: Path) -> None:
    done = _gpucheck(tmp_path, "--budget", "0")
    assert done.returncode == 2 and "--budget 0: give the seconds" in done.stderr
