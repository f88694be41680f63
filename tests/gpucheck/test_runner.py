"""The step runner: each step in its own process, its result handed back as JSON; a failing, a
crashing and an overrunning step each become a result, and the next step still runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpucheck import report
from gpucheck.result import StepResult
from gpucheck.runner import run_step

REPO = Path(__file__).resolve().parents[2]


def _step(code: str) -> list[str]:
    prelude = "from gpucheck.result import StepResult, check_row, write_result\n"
    return [sys.executable, "-c", prelude + code]


def test_passing_failing_crashing_and_overrunning_steps(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    steps = [
        (
            "ok",
            _step("write_result(StepResult('ok', 'passed', 'all good', [check_row('x', 1, 1, '±0', True)]))"),
            60,
        ),
        (
            "bad",
            _step(
                "write_result(StepResult.from_rows('bad', [check_row('y', 2, 1, '±0', False)], 'compared'))"
            ),
            60,
        ),
        ("crash", _step("print('loading'); raise SystemExit('boom: no such device')"), 60),
        ("slow", _step("import time\nprint('working', flush=True)\ntime.sleep(120)"), 1.0),
        ("after", _step("write_result(StepResult('after', 'skipped', 'no GPU here'))"), 60),
    ]
    results = [run_step(name, argv, timeout, tmp_path / "logs", env) for name, argv, timeout in steps]
    assert [r.name for r in results] == ["ok", "bad", "crash", "slow", "after"]
    by = {r.name: r for r in results}
    assert by["ok"].status == "passed" and by["ok"].rows[0]["ok"] is True
    assert by["bad"].status == "failed" and by["bad"].summary == "compared; missed: y"
    assert by["crash"].status == "error"
    assert by["crash"].summary == "exited 1 without a result: boom: no such device"
    assert by["slow"].status == "timeout" and by["slow"].summary == "stopped after 1 s: working"
    assert by["slow"].seconds is not None and by["slow"].seconds < 30
    assert by["after"].status == "skipped"
    assert all(Path(r.log or "").exists() for r in results)


def test_the_report_merges_a_partial_run_and_renders_rows(tmp_path: Path) -> None:
    first = [
        StepResult(
            "a",
            "passed",
            "fine",
            [
                {
                    "benchmark": "speed",
                    "value": 2.0,
                    "low": 1.5,
                    "high": 2.5,
                    "n": 3,
                    "unit": "×",
                    "target": "≥ 1.5",
                    "ok": True,
                }
            ],
        ),
        StepResult("b", "skipped", "no GPU"),
    ]
    merged = report.merge(None, {"host": "h", "gpus": []}, first, ["a", "b", "c"])
    second = [StepResult("b", "failed", "off by 3 W", [{"check": "power_w", "ours": 3, "ok": False}])]
    merged = report.merge(merged, {"host": "h", "gpus": []}, second, ["a", "b", "c"])
    assert [(s["name"], s["status"]) for s in merged["steps"]] == [("a", "passed"), ("b", "failed")]
    md_path, json_path = tmp_path / "r.md", tmp_path / "r.json"
    report.write(merged, json_path, md_path)
    assert report.load(json_path) == merged
    md = md_path.read_text()
    assert "| a | ✅ passed | fine |" in md and "| b | ❌ failed | off by 3 W |" in md
    assert "| speed | 2 | 1.5 | 2.5 | 3 | × | ≥ 1.5 | yes |" in md
    assert "| power_w | 3 | NO |" in md
