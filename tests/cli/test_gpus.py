"""`gpuwarden gpus`: a line of facts per GPU, its reading indented under it."""

from __future__ import annotations

import os
import sys

from tests import preloaded


def test_each_gpu_is_named_once_with_its_reading_under_it() -> None:
    env = {**os.environ, "GPUWARDEN_FAKE_NVML": "h100x2"}
    done = preloaded.run([sys.executable, "-m", "gpuwarden", "gpus"], env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    for facts, reading in (lines[0:2], lines[2:4]):
        assert facts.startswith("[") and "NVIDIA H100" in facts and "GPU-" in facts
        assert reading.startswith("    power ") and "util" in reading and "NVIDIA" not in reading
    assert done.stdout.count("NVIDIA H100") == 2
