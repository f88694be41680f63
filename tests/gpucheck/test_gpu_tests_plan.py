"""The GPU tests are skipped here before their fixtures are looked up, so a fixture they cannot
reach would only show on a GPU machine, where time is scarce. Plan them here instead."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\b.*\bmark\.gpu\b)", re.MULTILINE)


def test_every_gpu_test_finds_its_fixtures() -> None:
    plugin = "tests.gpucheck.plan_without_gpu"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/gpu",
            "--setup-plan",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            plugin,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_gpu_marked_tests_all_live_in_tests_gpu() -> None:
    """`make gpu-check` collects tests/gpu only (other folders need dev-only packages)."""
    elsewhere = [
        path.relative_to(REPO)
        for path in (REPO / "tests").rglob("test_*.py")
        if GPU_MARK.search(path.read_text(encoding="utf-8")) and path.parent.name != "gpu"
    ]
    assert elsewhere == []
