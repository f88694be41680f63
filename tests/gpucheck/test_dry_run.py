"""`python -m gpucheck` where there is no GPU: every step says so in one line, is marked skipped
with its reason in gpu-report.md / .json, and the command exits 0 (what CI runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from gpucheck.machine import nvml_missing
from gpucheck.steps import STEPS

REPO = Path(__file__).resolve().parents[2]


def _gpucheck(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    env.pop("GPUCHECK_DRY", None)
    return subprocess.run(
        [sys.executable, "-m", "gpucheck", "--out", str(tmp_path), "--logs", str(tmp_path / "logs"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )


@pytest.mark.slow
def test_without_a_gpu_every_step_is_skipped_with_its_reason(tmp_path: Path) -> None:
    reason = nvml_missing()
    if reason is None:
        pytest.skip("this machine has a GPU: the steps would run for real")
    done = _gpucheck(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split(":", 1)[0] for line in lines[:-1]] == [s.name for s in STEPS]
    assert all(f"skipped — {reason}" in line for line in lines[:-1]), lines
    assert lines[-1] == f"wrote {tmp_path / 'gpu-report.md'} and {tmp_path / 'gpu-report.json'}"
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert [s["name"] for s in report["steps"]] == [s.name for s in STEPS]
    assert {s["status"] for s in report["steps"]} == {"skipped"}
    assert {s["summary"] for s in report["steps"]} == {reason}
    assert all(Path(s["log"]).exists() and s["seconds"] is not None for s in report["steps"])
    assert report["machine"]["python"] and report["machine"]["gpu_status"]
    assert report["machine"]["torch"] == version("torch")  # read without importing torch
    md = (tmp_path / "gpu-report.md").read_text()
    assert md.startswith("# gpuwarden GPU check")
    for step in STEPS:
        assert f"| {step.name} | – skipped | {reason} |" in md


@pytest.mark.slow
def test_a_dry_run_skips_on_purpose_and_a_partial_run_keeps_the_other_steps(tmp_path: Path) -> None:
    assert _gpucheck(tmp_path, "--dry").returncode == 0
    again = _gpucheck(tmp_path, "--dry", "--steps", "nvml-truth,dashboard")
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.strip().splitlines()) == 3  # two steps and the report line
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert [s["name"] for s in report["steps"]] == [s.name for s in STEPS]  # none lost, in order
    assert {s["summary"] for s in report["steps"]} == {"dry run: nothing measured"}


def test_an_unknown_step_is_one_line(tmp_path: Path) -> None:
    done = _gpucheck(tmp_path, "--steps", "nvml-truth,warp-drive")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpucheck: unknown step 'warp-drive' — see --list"
    listed = _gpucheck(tmp_path, "--list")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [s.name for s in STEPS]
