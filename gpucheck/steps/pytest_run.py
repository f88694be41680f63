"""Run pytest on some tests and turn its JUnit XML into a step result: one row per test, plus
the figures the tests recorded with `record_property`."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpucheck.result import StepResult, check_row

REPO = Path(__file__).resolve().parents[2]


def run_pytest(name: str, args: list[str], timeout_s: float = 520.0) -> StepResult:
    with tempfile.TemporaryDirectory(prefix="gpucheck-pytest-") as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        argv += ["-o", f"timeout={int(timeout_s)}", *args]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout_s + 30)
        sys.stdout.write(done.stdout[-20000:])
        sys.stderr.write(done.stderr[-5000:])
        if not junit.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            return StepResult(name, "error", f"pytest wrote no report: {tail[0][:300]}")
        cases = parse_junit(junit)
    return summarise(name, cases)


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """[{id, outcome: passed|failed|error|skipped, message, seconds, properties}]"""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                text = (node.get("message") or node.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                break
        props = {p.get("name", ""): p.get("value") for p in case.iter("property")}
        cases.append(
            {
                "id": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "message": message,
                "seconds": float(case.get("time") or 0.0),
                "properties": props,
            }
        )
    return cases


def summarise(name: str, cases: list[dict[str, Any]]) -> StepResult:
    rows: list[dict[str, Any]] = []
    for c in cases:
        ok = None if c["outcome"] == "skipped" else c["outcome"] == "passed"
        rows.append(
            check_row(c["id"].rsplit("::", 1)[-1], c["outcome"], c["message"], f"{c['seconds']:.0f} s", ok)
        )
        rows += [check_row(f"  {key}", value, "", "", None) for key, value in c["properties"].items()]
    counts = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests collected"
    if counts["failed"] or counts["error"]:
        return StepResult(name, "failed", summary, rows)
    if counts["passed"]:
        return StepResult(name, "passed", summary, rows)
    reasons = sorted({c["message"] for c in cases if c["message"]})
    return StepResult(name, "skipped", summary + (f": {reasons[0]}" if reasons else ""), rows)
