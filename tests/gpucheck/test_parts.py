"""The parts of the GPU check that need no GPU: nvidia-smi parsing and tolerances, JUnit results,
and the wheel bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucheck.steps.nvml_truth import _agrees, _metric_row, _metrics, _reference, parse
from gpucheck.steps.pytest_run import parse_junit, summarise
from gpucheck.wheels import have_names, missing, requirement_name, requirements, wheel_name

METRICS = {m.name: m for m in _metrics()}
MIB = 2**20


def test_nvidia_smi_values_parse_to_our_numbers() -> None:
    assert parse(" 312.45 ") == 312.45
    assert parse("P0") == 0.0 and parse("P8") == 8.0
    assert parse("0x0000000000000004") == 4.0
    assert parse("[N/A]") is None and parse("[Not Supported]") is None and parse("N/A") is None


def test_memory_may_match_used_or_used_plus_reserved() -> None:
    smi: dict[str, float | None] = {"memory.used": 1000.0, "memory.reserved": 500.0}
    assert _reference(METRICS["mem_used"], smi) == [1000 * MIB, 1500 * MIB]
    assert _reference(METRICS["mem_used"], {"memory.used": 1000.0}) == [1000 * MIB]


def test_a_reading_agrees_within_tolerance_or_between_the_two_smi_readings() -> None:
    power = METRICS["power_w"]
    assert _agrees(power, 310.0, [300.0], [600.0])  # within 15 W of the first
    assert _agrees(power, 450.0, [300.0], [600.0])  # between the two
    assert not _agrees(power, 700.0, [300.0], [600.0])
    throttle = METRICS["throttle_reasons"]
    assert _agrees(throttle, 0x1, [0x0], [0x0])  # the idle bit is not a slow-down
    assert not _agrees(throttle, 0x4, [0x0], [0x0])  # a power cap one side only


def test_a_metric_row_counts_readings_and_accepts_na_on_both_sides() -> None:
    temp = METRICS["temperature_c"]
    near: list[tuple[float | None, list[float], list[float]]] = [(50.0, [50.0], [51.0])]
    far: list[tuple[float | None, list[float], list[float]]] = [(70.0, [50.0], [50.0])]
    row = _metric_row(temp, "busy", "GPU 0", near * 4 + far)
    assert row["ok"] is True and row["ours"] == "50 (4/5 within)"
    row = _metric_row(temp, "busy", "GPU 0", near * 3 + far * 2)
    assert row["ok"] is False
    fan = _metric_row(METRICS["fan_pct"], "idle", "GPU 0", [(None, [], [])] * 5)
    assert fan["ok"] is True and fan["reference"] == "N/A in both"
    one_sided = _metric_row(METRICS["fan_pct"], "idle", "GPU 0", [(None, [30.0], [30.0])] * 5)
    assert one_sided["ok"] is False


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_gpu" name="test_ok" time="3.5">
  <properties><property name="recovered at" value="4 × 4 after 1 retune(s)"/></properties>
</testcase>
<testcase classname="tests.gpu.test_gpu" name="test_bad" time="1.0"><failure message="assert 3 == 4">long text</failure></testcase>
<testcase classname="tests.gpu.test_gpu" name="test_none" time="0.0"><skipped message="needs an NVIDIA GPU"/></testcase>
</testsuite></testsuites>
"""


def test_junit_becomes_rows_and_a_status(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    cases = parse_junit(path)
    assert [c["outcome"] for c in cases] == ["passed", "failed", "skipped"]
    result = summarise("gpu-tests", cases)
    assert result.status == "failed" and result.summary == "1 passed, 1 failed, 1 skipped"
    assert result.rows[1] == {
        "check": "  recovered at",
        "ours": "4 × 4 after 1 retune(s)",
        "reference": "",
        "tolerance": "",
        "ok": None,
    }
    assert result.rows[2]["reference"] == "assert 3 == 4"
    skipped = summarise("gpu-tests", cases[2:])
    assert skipped.status == "skipped" and skipped.summary == "1 skipped: needs an NVIDIA GPU"


def test_wheel_bookkeeping(tmp_path: Path) -> None:
    assert requirement_name("Pydantic_Core>=2.7; python_version < '4'") == "pydantic-core"
    assert wheel_name(Path("pydantic_core-2.50.4-cp312-cp312-manylinux2014_x86_64.whl")) == "pydantic-core"
    have = tmp_path / "have.txt"
    have.write_text("# a comment\nnumpy==2.5.2\nPyYAML==6.0.3\ntorch @ file:///opt/torch\n\n")
    assert have_names(have) == {"numpy", "pyyaml", "torch"}
    names = {requirement_name(r) for r in requirements()}
    assert {"pydantic", "fastapi", "textual", "pytest", "nvitop", "gpustat"} <= names


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        (["pytest>=1"], []),
        (["pytest>=999"], ["pytest: {v} is installed, gpuwarden needs pytest>=999"]),
        (
            ["surely-absent-package>=1"],
            ["surely-absent-package: not installed (needed: surely-absent-package>=1)"],
        ),
        (['pywin32>=1; sys_platform == "win32"'], []),
    ],
)
def test_missing_requirements_are_named_one_line_each(wanted: list[str], expected: list[str]) -> None:
    from importlib import metadata

    version = metadata.version("pytest")
    assert missing(None, wanted) == [e.format(v=version) for e in expected]
